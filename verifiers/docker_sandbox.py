"""The cluster sandbox tier: one throwaway Docker container per call, via the docker SDK.

Same interface as `BubblewrapSandbox`. It needs a reachable Docker engine, which this CPU
machine does not have: the constructor then raises a clear RuntimeError (tested).
"""

from __future__ import annotations

import time

from verifiers.sandbox import SandboxLimits, SandboxResult, classify_exit, failure_result, truncate_output


class DockerSandbox:
    """One throwaway container per call (needs a reachable Docker engine)."""

    # Code and stdin travel as env vars so that no stdin attach is needed.
    _BOOTSTRAP = (
        "import io,os,sys;sys.stdin=io.StringIO(os.environ.pop('SANDBOX_STDIN'));"
        "c=os.environ.pop('SANDBOX_CODE');"
        "exec(compile(c,'<policy>','exec'),{'__name__':'__main__'})"
    )

    def __init__(
        self, limits: SandboxLimits | None = None, pool_size: int = 2, *, image: str = "python:3.11-slim"
    ) -> None:
        from concurrent.futures import ThreadPoolExecutor

        try:
            import docker
        except ImportError as exc:
            raise RuntimeError("the docker SDK is not installed (pip install docker)") from exc
        try:
            self._client = docker.from_env()
            self._client.ping()
        except Exception as exc:  # DockerException, requests errors, ...
            raise RuntimeError(f"Docker engine not reachable: {exc}") from exc
        self._docker = docker
        self.limits = limits or SandboxLimits()
        self.image = image
        self._calls = ThreadPoolExecutor(pool_size, thread_name_prefix="docker-call")

    def run_python(self, code: str, *, stdin: str = "") -> SandboxResult:
        lim, mb = self.limits, 1024 * 1024
        ulimit = self._docker.types.Ulimit
        start = time.monotonic()
        try:
            container = self._client.containers.run(
                self.image,
                ["python", "-I", "-c", self._BOOTSTRAP],
                detach=True,
                environment={"SANDBOX_CODE": code, "SANDBOX_STDIN": stdin},
                network_disabled=True,
                mem_limit=f"{lim.memory_mb}m",
                memswap_limit=f"{lim.memory_mb}m",
                pids_limit=lim.max_processes,
                read_only=True,
                tmpfs={"/tmp": "size=16m"},
                user="65534:65534",
                working_dir="/tmp",
                cpu_period=100_000,
                cpu_quota=100_000,
                # no capabilities, no setuid escalation; Docker's default seccomp profile applies
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                ulimits=[
                    ulimit(name="cpu", soft=lim.cpu_s, hard=lim.cpu_s + 1),
                    ulimit(name="fsize", soft=lim.max_file_mb * mb, hard=lim.max_file_mb * mb),
                    ulimit(name="nofile", soft=64, hard=64),
                    ulimit(name="core", soft=0, hard=0),
                ],
            )
        except Exception as exc:
            return failure_result(f"container start: {exc}", time.monotonic() - start)
        try:
            return self._collect(container, start)
        finally:
            try:
                container.remove(force=True)
            except Exception:
                pass  # already gone; nothing else to clean up

    def _collect(self, container, start: float) -> SandboxResult:
        lim = self.limits
        try:
            status = container.wait(timeout=lim.timeout_s)
            exit_code, timed_out = int(status.get("StatusCode", -1)), False
        except Exception:  # requests' ReadTimeout / ConnectionError on timeout
            try:
                container.kill()
            except Exception:
                pass  # it exited just after the deadline; the result stands
            exit_code, timed_out = None, True
        duration = time.monotonic() - start
        out = container.logs(stdout=True, stderr=False)
        err = container.logs(stdout=False, stderr=True)
        container.reload()
        error = classify_exit(exit_code, timed_out, err[-256:])
        if container.attrs.get("State", {}).get("OOMKilled"):
            error = "memory"
        return SandboxResult(
            truncate_output(out, lim.max_output_bytes),
            truncate_output(err, lim.max_output_bytes),
            exit_code,
            timed_out,
            duration,
            error,
        )

    def run_many(self, codes: list[str]) -> list[SandboxResult]:
        return list(self._calls.map(self.run_python, codes))

    def close(self) -> None:
        self._calls.shutdown(wait=True)
        self._client.close()

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
