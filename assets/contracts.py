"""Great Expectations data contracts for the flywheel's tabular assets, exposed as Dagster checks.

Three contracts are defined:

* ``tasks``            -- ``training_tasks`` / ``benchmark_tasks``
* ``sft_trajectories`` -- supervised fine-tuning trajectories
* ``rollout_batches``  -- RL rollouts (token ids, tool mask, behaviour log-probs)

``dagster-ge`` does not support Great Expectations 1.x, so the glue is written here against the
GE 1.x fluent API: one ephemeral data context per process (created lazily, reused), one pandas
data source / dataframe asset / whole-dataframe batch definition (the frame is passed as a batch
parameter), and one expectation suite per (contract, families, max_level, columns present),
cached in that context.

GE cannot look inside list-valued columns, so :func:`derive_columns` (pure pandas/python, in
:mod:`assets.contract_specs` together with the contract specs and report types) first
turns each list column into scalar columns -- lengths, counts of invalid values, the number of
policy tokens, the max log-prob, ... -- and, for scalar columns whose dtype does not already pin
the declared python type (object / mixed dtypes), per-value type names (``<col>__type``); the
suite then validates those with standard expectations. Columns are checked for presence first
(``expect_column_to_exist``) and every expectation that needs a missing column is skipped, so a
missing column shows up as one clear failure naming it rather than as a ``KeyError``.

:func:`contract_check` wraps :func:`validate_contract` in a blocking ``@asset_check`` with ERROR
severity: a failed contract fails the run and keeps downstream assets from materialising.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

# Must be set before great_expectations is first imported (it is imported lazily below so that
# loading the Dagster code location does not pay GE's multi-second import).
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import numpy as np
import pandas as pd
from dagster import (
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)

# The pure (GE-free) half: specs, report types, derived columns.
from assets.contract_specs import (
    COMPOUND_UNIQUE,
    CONTRACT_COLUMNS,
    DERIVED_NOTES,
    EXACT_COLUMNS,
    FAMILIES_PLACEHOLDER,
    LIST_KINDS,
    MAX_LEVEL_PLACEHOLDER,
    SPECS,
    SPLITS,
    ContractFailure,
    ContractReport,
    derive_columns,
    unknown_contract,
)

__all__ = ["contract_check", "validate_contract"]


# --------------------------------------------------------------------------------------------
# Expectation suite construction
# --------------------------------------------------------------------------------------------


def _build_expectations(
    contract: str,
    present: frozenset[str],
    derived: frozenset[str],
    families: tuple[str, ...],
    max_level: int,
    splits: tuple[str, ...] = SPLITS,
) -> list[Any]:
    import great_expectations.expectations as gxe

    cols = SPECS[contract]
    exps: list[Any] = [gxe.ExpectTableRowCountToBeBetween(min_value=1)]
    for col in cols:
        exps.append(gxe.ExpectColumnToExist(column=col.name))
    if contract in EXACT_COLUMNS:
        exps.append(
            gxe.ExpectTableColumnsToMatchSet(column_set=sorted({c.name for c in cols} | derived), exact_match=True)
        )

    for col in cols:
        if col.name not in present:
            continue
        name = col.name
        if col.kind not in LIST_KINDS:
            exps.append(gxe.ExpectColumnValuesToNotBeNull(column=name))
            if f"{name}__type" in derived:
                exps.append(gxe.ExpectColumnValuesToBeInSet(column=f"{name}__type", value_set=[col.kind]))
            if col.unique:
                exps.append(gxe.ExpectColumnValuesToBeUnique(column=name))
            if col.value_set is not None:
                value_set = (
                    families
                    if col.value_set == FAMILIES_PLACEHOLDER
                    else splits
                    if col.value_set == SPLITS
                    else col.value_set
                )
                exps.append(gxe.ExpectColumnValuesToBeInSet(column=name, value_set=list(value_set)))
            if col.min_value is not None or col.max_value is not None:
                max_value = max_level if col.max_value == MAX_LEVEL_PLACEHOLDER else col.max_value
                exps.append(
                    gxe.ExpectColumnValuesToBeBetween(column=name, min_value=col.min_value, max_value=max_value)
                )
            if col.nonblank:
                exps.append(gxe.ExpectColumnValuesToMatchRegex(column=name, regex=r"\S"))
            if col.json:
                exps.append(gxe.ExpectColumnValuesToBeJsonParseable(column=name))
            continue

        length = f"{name}_len"
        exps.append(gxe.ExpectColumnValuesToNotBeNull(column=length))
        exps.append(gxe.ExpectColumnValuesToBeBetween(column=length, min_value=1))
        if col.kind == "token_ids":
            exps.append(gxe.ExpectColumnValuesToBeBetween(column=f"{name}_invalid", min_value=0, max_value=0))
        elif col.kind == "tool_mask":
            exps.append(gxe.ExpectColumnValuesToBeBetween(column="tool_mask_non_binary", min_value=0, max_value=0))
            exps.append(gxe.ExpectColumnValuesToBeBetween(column="policy_token_count", min_value=1))
        elif col.kind == "logprobs":
            exps.append(gxe.ExpectColumnValuesToBeBetween(column="logprobs_nonfinite", min_value=0, max_value=0))
            exps.append(gxe.ExpectColumnValuesToBeBetween(column="logprob_max", max_value=0.0))
        if col.kind in ("tool_mask", "logprobs") and "completion_ids_len" in derived:
            exps.append(gxe.ExpectColumnPairValuesToBeEqual(column_A=length, column_B="completion_ids_len"))

    if "logprob_nonzero_on_tool" in derived:
        exps.append(gxe.ExpectColumnValuesToBeBetween(column="logprob_nonzero_on_tool", min_value=0, max_value=0))
    for combo in COMPOUND_UNIQUE.get(contract, ()):
        if all(c in present for c in combo):
            exps.append(gxe.ExpectCompoundColumnsToBeUnique(column_list=list(combo)))
    return exps


# --------------------------------------------------------------------------------------------
# GE runtime: one ephemeral context per process, reused
# --------------------------------------------------------------------------------------------


class _GXRuntime:
    def __init__(self) -> None:
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self._gx = gx
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        self.batch_definition = (
            self.context.data_sources.add_pandas("flywheel_contracts")
            .add_dataframe_asset("frame")
            .add_batch_definition_whole_dataframe("whole_frame")
        )
        self._suites: dict[tuple, Any] = {}

    def suite(self, key: tuple, build: Callable[[], list[Any]]) -> Any:
        suite = self._suites.get(key)
        if suite is None:
            name = f"{key[0]}_contract_{len(self._suites)}"
            suite = self.context.suites.add(self._gx.ExpectationSuite(name=name, expectations=build()))
            self._suites[key] = suite
        return suite

    def validate(self, frame: pd.DataFrame, suite: Any) -> Any:
        batch = self.batch_definition.get_batch(batch_parameters={"dataframe": frame})
        return batch.validate(suite, result_format="BASIC")


_RUNTIME: _GXRuntime | None = None
_LOCK = threading.RLock()


def _runtime() -> _GXRuntime:
    global _RUNTIME
    with _LOCK:
        if _RUNTIME is None:
            _RUNTIME = _GXRuntime()
        return _RUNTIME


# --------------------------------------------------------------------------------------------
# Result -> ContractFailure
# --------------------------------------------------------------------------------------------

_MAX_DETAILS = 300


def _plain(value: Any) -> Any:
    """numpy scalars -> python scalars (recursively in lists/tuples), for readable reprs."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def _short(value: Any, limit: int = 120) -> str:
    text = repr(_plain(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _column_of(kwargs: Mapping[str, Any]) -> str | None:
    if "column" in kwargs:
        return str(kwargs["column"])
    if "column_A" in kwargs and "column_B" in kwargs:
        return f"{kwargs['column_A']}, {kwargs['column_B']}"
    if "column_list" in kwargs:
        return ", ".join(str(c) for c in kwargs["column_list"])
    return None


def _note_for(column: str | None) -> str | None:
    if column is None or ", " in column:
        if column and column.endswith(", completion_ids_len"):
            return "list length must equal the length of completion_ids"
        return None
    if column.endswith("__type"):
        return DERIVED_NOTES["__type"].format(src=column[: -len("__type")])
    for suffix in ("_len", "_invalid"):
        src = column[: -len(suffix)]
        if column.endswith(suffix) and src in {"prompt_ids", "completion_ids", "tool_mask", "logprobs"}:
            return DERIVED_NOTES[suffix].format(src=src)
    return DERIVED_NOTES.get(column)


def _details(res: Any, kwargs: Mapping[str, Any], column: str | None) -> str:
    exc = getattr(res, "exception_info", None) or {}
    if isinstance(exc, Mapping) and exc.get("raised_exception"):
        text = f"expectation raised: {exc.get('exception_message')}"
    else:
        result = dict(res.result or {})
        parts: list[str] = []
        if "unexpected_count" in result:
            parts.append(f"{result.get('unexpected_count')} of {result.get('element_count')} rows unexpected")
            examples = result.get("partial_unexpected_list") or []
            if examples:
                parts.append(f"e.g. {_short(list(examples)[:5])}")
        elif "observed_value" in result:
            mismatched = (result.get("details") or {}).get("mismatched")
            if mismatched:  # column-set expectations: the mismatch is what matters
                parts.extend(f"{k} columns {_short(v)}" for k, v in mismatched.items() if v)
            else:
                parts.append(f"observed {_short(result['observed_value'])}")
        elif res.expectation_config.type == "expect_column_to_exist":
            parts.append("column is missing")
        expected = {
            k: v for k, v in kwargs.items() if k in ("value_set", "min_value", "max_value", "regex") and v is not None
        }
        if expected:
            parts.append("expected " + ", ".join(f"{k}={_short(v, 80)}" for k, v in expected.items()))
        text = "; ".join(parts) or "failed"
    note = _note_for(column)
    if note:
        text = f"{text} [{note}]"
    return text if len(text) <= _MAX_DETAILS else text[: _MAX_DETAILS - 3] + "..."


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def _ge_frame(contract: str, df: pd.DataFrame, derived: pd.DataFrame) -> pd.DataFrame:
    """The narrow frame handed to GE: scalar contract columns plus the derived columns.

    GE copies the whole batch frame for many metrics (null filtering), so width matters. List
    columns are only validated through their derived columns: they are kept by name (so
    ``expect_column_to_exist`` sees them) with a cheap placeholder (their length) as values.
    Extra columns only matter to contracts with an exact column set, and only by name.
    """
    kinds = {c.name: c.kind for c in SPECS[contract]}
    data: dict[str, Any] = {}
    for name in df.columns:
        if name in derived.columns:
            continue  # derived columns win over same-named input columns
        kind = kinds.get(name)
        if kind is None:
            if contract in EXACT_COLUMNS:
                data[name] = pd.Series(None, index=df.index, dtype=object)
        elif kind in LIST_KINDS:
            data[name] = derived[f"{name}_len"]
        else:
            data[name] = df[name]
    for name in derived.columns:
        data[name] = derived[name]
    return pd.DataFrame(data, index=df.index)


def _registered_families() -> tuple[tuple[str, ...], int]:
    """The task families registered now (the built-in ones, and those a config's modules added)
    and the highest level any of them has."""
    import environments  # noqa: F401, PLC0415 (registers the built-in families; only task contracts need it)
    from environments.family import FAMILIES, get_family  # noqa: PLC0415

    names = tuple(FAMILIES.names())
    return names, max(max(get_family(n).levels) for n in names)


def _checks_families(contract: str) -> bool:
    return any(c.value_set == FAMILIES_PLACEHOLDER or c.max_value == MAX_LEVEL_PLACEHOLDER for c in SPECS[contract])


def validate_contract(
    contract: str,
    df: pd.DataFrame,
    *,
    families: Iterable[str] | None = None,
    max_level: int | None = None,
    splits: Iterable[str] = SPLITS,
) -> ContractReport:
    """Validate ``df`` against ``contract`` with Great Expectations and summarise the result.
    ``families`` / ``max_level`` None: the registered task families and the highest of their levels."""
    if contract not in SPECS:
        raise unknown_contract(contract)
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"contract {contract!r} validates a pandas DataFrame, got {type(df).__name__}")
    if families is None or max_level is None:
        registered, highest = _registered_families()
        families = registered if families is None else families
        max_level = highest if max_level is None else max_level
    families_t = tuple(sorted({str(f) for f in families}))
    max_level = int(max_level)

    derived = derive_columns(contract, df)
    frame = _ge_frame(contract, df, derived)

    present = frozenset(str(c) for c in df.columns)
    derived_names = frozenset(derived.columns)
    splits_t = tuple(sorted(set(splits)))
    key = (contract, families_t, max_level, splits_t, present & set(CONTRACT_COLUMNS[contract]), derived_names)
    if contract in EXACT_COLUMNS:
        key = (*key, present)  # the exact column-set expectation depends on every column

    with _LOCK:
        rt = _runtime()
        suite = rt.suite(
            key,
            lambda: _build_expectations(contract, present, derived_names, families_t, max_level, splits_t),
        )
        order = {e.id: i for i, e in enumerate(suite.expectations)}
        result = rt.validate(frame, suite)

    failures: list[tuple[int, ContractFailure]] = []
    for res in result.results:
        if res.success:
            continue
        cfg = res.expectation_config
        kwargs = dict(cfg.kwargs)
        column = _column_of(kwargs)
        failures.append(
            (
                order.get(getattr(cfg, "id", None), len(order)),
                ContractFailure(expectation=cfg.type, column=column, details=_details(res, kwargs, column)),
            )
        )
    failures.sort(key=lambda item: item[0])
    return ContractReport(
        contract=contract,
        success=bool(result.success) and not failures,
        evaluated=len(result.results),
        failures=tuple(f for _, f in failures),
        rows=len(df),
    )


def _md_cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _failures_markdown(report: ContractReport) -> str:
    if not report.failures:
        return "No failures."
    lines = ["| expectation | column | details |", "| --- | --- | --- |"]
    for f in report.failures:
        lines.append(f"| {_md_cell(f.expectation)} | {_md_cell(f.column or '(table)')} | {_md_cell(f.details)} |")
    return "\n".join(lines)


def contract_check(
    asset_key: Any,
    contract: str,
    *,
    partitions_def: Any = None,
    families: Iterable[str] | None = None,
    max_level: int = 4,
    name: str | None = None,
) -> AssetChecksDefinition:
    """A blocking, ERROR-severity Dagster asset check validating ``asset_key``'s value against ``contract``.

    ``asset_key`` is anything Dagster can coerce to an asset key (a string such as
    ``"training_tasks"``, a key path, an ``AssetKey`` or the asset definition). The asset's value
    is loaded by the asset's IO manager (for a partitioned asset, pass the asset's
    ``partitions_def`` so the check runs per partition on that partition's value).

    ``families=None``: the task families registered when the check runs, after the ``settings``
    resource's config has imported its own (environments/family.py), and the highest of their
    levels as ``max_level``; a family added by a module is then accepted without editing this.
    """
    if contract not in SPECS:
        raise unknown_contract(contract)
    families_t: tuple[str, ...] | None = (
        None if families is None else (families,) if isinstance(families, str) else tuple(families)
    )
    check_kwargs: dict[str, Any] = {}
    if partitions_def is not None:
        check_kwargs["partitions_def"] = partitions_def
    if families_t is None and _checks_families(contract):
        check_kwargs["required_resource_keys"] = {"settings"}

    @asset_check(
        asset=asset_key,
        name=name or f"{contract}_contract",
        blocking=True,
        description=(
            f"Great Expectations '{contract}' data contract "
            + (
                f"(families={list(families_t)}, max_level={max_level})"
                if families_t is not None
                else "(the registered task families)"
            )
            + "; blocks downstream assets on failure."
        ),
        metadata={"contract": contract},
        **check_kwargs,
    )
    def _contract_check(context, frame):
        # ``frame`` is the checked asset's value: @asset_check binds the single non-context
        # parameter to the target asset regardless of its name. (No annotations: with postponed
        # evaluation Dagster would see the context annotation as a string and reject it.)
        if families_t is None and _checks_families(contract):
            cfg = context.resources.settings.config  # resolving it imports the config's own family modules
            report = validate_contract(contract, frame, splits=(*SPLITS, *cfg.benchmark.suites))
        elif families_t is None:  # nothing in this contract depends on the families
            report = validate_contract(contract, frame, families=(), max_level=0)
        else:
            report = validate_contract(contract, frame, families=families_t, max_level=max_level)
        description = report.message() or "all expectations met"
        if not report.success:
            context.log.error(description)
        return AssetCheckResult(
            passed=report.success,
            severity=AssetCheckSeverity.ERROR,
            description=description,
            metadata={
                "rows": report.rows,
                "expectations_evaluated": report.evaluated,
                "failures": MetadataValue.md(_failures_markdown(report)),
            },
        )

    return _contract_check
