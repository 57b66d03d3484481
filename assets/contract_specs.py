"""Contract specifications, report types and derived columns for the flywheel's data contracts.

This module holds the pure, Great-Expectations-free half of :mod:`assets.contracts`:

* the per-contract column specs (``_Col`` / ``SPECS``), the public column lists
  (``CONTRACTS`` / ``CONTRACT_COLUMNS``) and constants such as ``STOP_REASONS`` / ``SPLITS``;
* the report types :class:`ContractFailure` / :class:`ContractReport`;
* :func:`derive_columns`, which turns list-valued columns into the scalar columns GE validates.

It is kept separate so that it can be imported (and unit-tested) with pandas/numpy only, without
paying for -- or even having installed -- great_expectations or dagster. :mod:`assets.contracts`
builds the GE expectation suites and the Dagster asset checks on top of it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "CONTRACTS",
    "CONTRACT_COLUMNS",
    "SPLITS",
    "STOP_REASONS",
    "ContractFailure",
    "ContractReport",
    "derive_columns",
]


# --------------------------------------------------------------------------------------------
# Contract specifications
# --------------------------------------------------------------------------------------------

FAMILIES_PLACEHOLDER = "<families>"  # placeholder for the caller-supplied family set
MAX_LEVEL_PLACEHOLDER = "<max_level>"  # placeholder for the caller-supplied max level

STOP_REASONS = ("answer", "eos", "max_turns", "max_tokens")
SPLITS = ("train", "benchmark")


@dataclass(frozen=True)
class _Col:
    """One column of a contract. ``kind`` is a scalar python type name or a list-column kind."""

    name: str
    kind: str  # "str" | "int" | "bool" | "token_ids" | "tool_mask" | "logprobs"
    unique: bool = False
    value_set: tuple[Any, ...] | str | None = None  # or FAMILIES_PLACEHOLDER
    min_value: int | None = None
    max_value: int | str | None = None  # or MAX_LEVEL_PLACEHOLDER
    nonblank: bool = False
    json: bool = False


LIST_KINDS = ("token_ids", "tool_mask", "logprobs")

_COMMON_TRAJECTORY_HEAD = (
    _Col("trajectory_id", "str", unique=True, nonblank=True),
    _Col("task_id", "str", nonblank=True),
    _Col("family", "str", value_set=FAMILIES_PLACEHOLDER),
    _Col("level", "int", min_value=1, max_value=MAX_LEVEL_PLACEHOLDER),
)

SPECS: dict[str, tuple[_Col, ...]] = {
    "tasks": (
        _Col("task_id", "str", unique=True, nonblank=True),
        _Col("family", "str", value_set=FAMILIES_PLACEHOLDER),
        _Col("level", "int", min_value=1, max_value=MAX_LEVEL_PLACEHOLDER),
        _Col("prompt", "str", nonblank=True),
        _Col("answer", "str"),
        _Col("split", "str", value_set=SPLITS),
        _Col("metadata", "str", json=True),
    ),
    "sft_trajectories": (
        *_COMMON_TRAJECTORY_HEAD,
        _Col("strategy", "str"),
        _Col("prompt_ids", "token_ids"),
        _Col("completion_ids", "token_ids"),
        _Col("tool_mask", "tool_mask"),
        _Col("completion", "str"),
        _Col("correct", "bool"),
    ),
    "knowledge_base": (
        _Col("name", "str", unique=True, nonblank=True),
        # document: a user's corpus
        _Col("type", "str", value_set=("person", "company", "city", "country", "document")),
        _Col("relations", "str", json=True),
        _Col("doc_id", "str"),
        _Col("title", "str"),
        _Col("text", "str"),
    ),
    "search_index": (  # one row per indexed passage (assets/data.py, search_index)
        _Col("doc_id", "str", unique=True, nonblank=True),
        _Col("terms", "int", min_value=1),  # a passage with no indexable term can never be found
        _Col("self_rank", "int", min_value=0),  # its rank when its own text is the query (0: not in the top k)
    ),
    "task_pool": (
        _Col("task_id", "str", unique=True, nonblank=True),
        _Col("family", "str", value_set=FAMILIES_PLACEHOLDER),
        _Col("level", "int", min_value=1, max_value=MAX_LEVEL_PLACEHOLDER),
        _Col("attempts", "int", min_value=0),
        _Col("rounds", "int", min_value=0),
        _Col("last_round", "int", min_value=0),
    ),
    "rollout_batches": (
        *_COMMON_TRAJECTORY_HEAD,
        _Col("group_id", "str"),
        _Col("sample_index", "int", min_value=0),
        _Col("round", "int", min_value=1),
        _Col("step", "int", min_value=0),
        _Col("policy_version", "str"),
        _Col("prompt_ids", "token_ids"),
        _Col("completion_ids", "token_ids"),
        _Col("tool_mask", "tool_mask"),
        _Col("logprobs", "logprobs"),
        _Col("completion", "str"),
        _Col("turns", "int", min_value=1),
        _Col("num_tool_calls", "int", min_value=0),
        _Col("tool_calls", "str", json=True),
        _Col("stop_reason", "str", value_set=STOP_REASONS),
    ),
}

# Contracts whose column set must match exactly (no extra columns allowed).
EXACT_COLUMNS = frozenset({"tasks", "knowledge_base"})
# Column combinations that must be unique together.
COMPOUND_UNIQUE: dict[str, tuple[tuple[str, ...], ...]] = {
    "rollout_batches": (("group_id", "sample_index"),),
}

CONTRACTS: tuple[str, ...] = tuple(SPECS)
CONTRACT_COLUMNS: Mapping[str, tuple[str, ...]] = {name: tuple(c.name for c in cols) for name, cols in SPECS.items()}

# Explanations appended to failures on derived columns, so the report says what was meant.
DERIVED_NOTES = {
    "_len": "length of the list in '{src}' (null = not a list)",
    "_invalid": "number of entries of '{src}' that are not non-negative ints",
    "tool_mask_non_binary": "number of tool_mask entries not in {0, 1}",
    "policy_token_count": "number of tool_mask entries equal to 1 (policy tokens)",
    "logprobs_nonfinite": "number of logprobs entries that are not finite numbers",
    "logprob_max": "largest log-prob in the row (must be <= 0)",
    "logprob_nonzero_on_tool": "number of logprobs != 0.0 where tool_mask == 0",
    "__type": "python type of the values of '{src}'",
}


def unknown_contract(contract: str) -> ValueError:
    return ValueError(f"unknown contract {contract!r}; available contracts: {', '.join(CONTRACTS)}")


# --------------------------------------------------------------------------------------------
# Report types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContractFailure:
    expectation: str  # GE expectation type, e.g. "expect_column_values_to_be_unique"
    column: str | None  # column (or "a, b" for pair / compound expectations); None = table-level
    details: str  # observed value / unexpected examples, short


@dataclass(frozen=True)
class ContractReport:
    contract: str
    success: bool
    evaluated: int
    failures: tuple[ContractFailure, ...]
    rows: int

    def message(self) -> str:
        lines = []
        for f in self.failures:
            where = f"column '{f.column}'" if f.column is not None else "table"
            lines.append(f"{self.contract}: {f.expectation} failed on {where}: {f.details}")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Derived scalar columns (pure)
# --------------------------------------------------------------------------------------------


def _is_null(v: Any) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    return isinstance(v, float) and math.isnan(v)


def _type_name(v: Any) -> str | None:
    if _is_null(v):
        return None
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, numbers.Integral):
        return "int"
    if isinstance(v, numbers.Real):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, (list, tuple, np.ndarray)):
        return "list"
    return type(v).__name__


def _as_list(v: Any) -> list | None:
    if isinstance(v, (list, tuple)):
        return list(v)
    if isinstance(v, np.ndarray) and v.ndim == 1:
        return v.tolist()
    return None


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _is_finite_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)) and math.isfinite(float(x))


def _dtype_kind(dtype: Any) -> str | None:
    """The python type every non-null value of a column with this dtype has, if it is definite."""
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_integer_dtype(dtype):
        return "int"
    if pd.api.types.is_float_dtype(dtype):
        return "float"
    if isinstance(dtype, pd.StringDtype):
        return "str"
    return None  # object / mixed: values must be inspected one by one


def _type_names(series: pd.Series) -> pd.Series:
    """Python type name of each value of ``series`` (None for nulls).

    Columns with a definite dtype (bool / integer / float / string) are named in one go; only
    object (or otherwise mixed) columns are inspected value by value.
    """
    uniform = _dtype_kind(series.dtype)
    if uniform is None:
        return pd.Series([_type_name(v) for v in series.tolist()], index=series.index, dtype=object)
    names = np.full(len(series), uniform, dtype=object)
    names[series.isna().to_numpy()] = None
    return pd.Series(names, index=series.index, dtype=object)


def _int_series(values: list[int | None], index: pd.Index) -> pd.Series:
    return pd.Series(pd.array(values, dtype="Int64"), index=index)


def derive_columns(contract: str, df: pd.DataFrame) -> pd.DataFrame:
    """Scalar columns derived from ``df`` for ``contract``, indexed like ``df``.

    Only derivations whose source columns are present are computed. Produces:

    * ``<col>__type`` for scalar columns whose dtype does not prove the contract's python type:
      the type name of each value (None for nulls);
    * ``<col>_len`` for list columns (None when the value is not a list);
    * ``prompt_ids_invalid`` / ``completion_ids_invalid``: entries that are not ints >= 0;
    * ``tool_mask_non_binary`` (entries not in {0, 1}) and ``policy_token_count`` (entries == 1);
    * ``logprobs_nonfinite``, ``logprob_max`` (over finite entries) and
      ``logprob_nonzero_on_tool`` (logprobs != 0.0 at positions where tool_mask == 0).
    """
    if contract not in SPECS:
        raise unknown_contract(contract)
    index = df.index
    out: dict[str, pd.Series] = {}
    lists: dict[str, list[list | None]] = {}

    for col in SPECS[contract]:
        if col.name not in df.columns:
            continue
        series = df[col.name]
        if col.kind not in LIST_KINDS:
            if _dtype_kind(series.dtype) != col.kind:  # the dtype alone does not prove the type
                out[f"{col.name}__type"] = _type_names(series)
            continue
        as_lists = [_as_list(v) for v in series.tolist()]
        lists[col.name] = as_lists
        out[f"{col.name}_len"] = _int_series([len(v) if v is not None else None for v in as_lists], index)
        if col.kind == "token_ids":
            out[f"{col.name}_invalid"] = _int_series(
                [None if v is None else sum(1 for x in v if not (_is_int(x) and x >= 0)) for v in as_lists],
                index,
            )
        elif col.kind == "tool_mask":
            out["tool_mask_non_binary"] = _int_series(
                [None if v is None else sum(1 for x in v if not (_is_int(x) and x in (0, 1))) for v in as_lists],
                index,
            )
            out["policy_token_count"] = _int_series(
                [None if v is None else sum(1 for x in v if _is_int(x) and x == 1) for v in as_lists],
                index,
            )
        elif col.kind == "logprobs":
            out["logprobs_nonfinite"] = _int_series(
                [None if v is None else sum(1 for x in v if not _is_finite_number(x)) for v in as_lists],
                index,
            )
            maxima = []
            for v in as_lists:
                finite = [float(x) for x in v if _is_finite_number(x)] if v is not None else []
                maxima.append(max(finite) if finite else np.nan)
            out["logprob_max"] = pd.Series(maxima, index=index, dtype="float64")

    if "tool_mask" in lists and "logprobs" in lists:
        counts: list[int | None] = []
        for mask, lps in zip(lists["tool_mask"], lists["logprobs"]):
            if mask is None or lps is None:
                counts.append(None)
                continue
            counts.append(
                sum(
                    1
                    for m, lp in zip(mask, lps)
                    if _is_int(m) and m == 0 and not (_is_finite_number(lp) and float(lp) == 0.0)
                )
            )
        out["logprob_nonzero_on_tool"] = _int_series(counts, index)

    return pd.DataFrame(out, index=index)
