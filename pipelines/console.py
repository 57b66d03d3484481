"""What `make run` prints, and the log file that keeps the rest.

The console gets the progress lines (INFO) and, for a step that fails or is retried, one line
naming the step and the error; the full text of every event, tracebacks included, goes to
FLYWHEEL_HOME/logs/<flywheel id>.log, whose path is printed at the start and under a failure.
The Dagster UI keeps its own full run log either way: this is only the terminal's view.

`flywheel_console` is a Dagster logger (Definitions(loggers=...)); `make run` selects it in its run
config. Runs launched elsewhere (the UI, a schedule) keep Dagster's default console logger.
"""

from __future__ import annotations

import _thread
import logging
import signal
import sys
import threading
from pathlib import Path

from dagster import DagsterEventType, Field, logger

# Events whose Dagster message carries a whole traceback: shortened on the console.
FAILURE_EVENTS = frozenset(
    {
        DagsterEventType.STEP_FAILURE,
        DagsterEventType.RUN_FAILURE,
        DagsterEventType.STEP_UP_FOR_RETRY,
        DagsterEventType.ASSET_CHECK_EVALUATION,
    }
)
FORMAT = "%(asctime)s - %(levelname)s - %(message)s"


def short(text: str, log_file: str) -> str:
    """The first line of a failure message and the error's own first line, then where the rest is.
    Dagster's message is `<what failed>.\\n\\n<wrapper error>:\\n\\n<the error>: <its message>\\n\\nStack Trace: …`."""
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    if len(paragraphs) <= 1 and "\n" not in text:
        return text
    head = paragraphs[0].splitlines()[0]
    causes = [
        " ".join(
            line.strip() for line in p.splitlines()[:3]
        )  # an error's first lines: "file X has 1 problem(s): row 1: …"
        for p in paragraphs[1:]
        if not p.startswith(("Stack Trace", "File ", "The above exception"))
        and "DagsterExecutionStepExecutionError" not in p
    ]
    cause = f" {causes[0]}" if causes else ""
    return f"{head}{cause} (full text: {log_file})"


class _Console(logging.Formatter):
    def __init__(self, log_file: str):
        super().__init__(FORMAT)
        self.log_file = log_file

    def format(self, record: logging.LogRecord) -> str:
        meta = getattr(record, "dagster_meta", None) or {}
        event = meta.get("dagster_event")
        if event is not None and event.event_type in FAILURE_EVENTS:
            record = logging.makeLogRecord(
                {**record.__dict__, "msg": short(record.getMessage(), self.log_file), "args": ()}
            )
        return super().format(record)


@logger(
    {
        "log_file": Field(str, description="Where the full text of every event goes (appended)."),
        "log_level": Field(str, is_required=False, default_value="INFO", description="The console's threshold."),
    },
    description="Progress lines and one-line failures on the console; everything, tracebacks included, in log_file.",
)
def flywheel_console(init_context) -> logging.Logger:
    log_file = init_context.logger_config["log_file"]
    out = logging.Logger("flywheel", level=logging.DEBUG)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(init_context.logger_config["log_level"])
    console.setFormatter(_Console(log_file))
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    full = logging.FileHandler(log_file)
    full.setLevel(logging.DEBUG)
    full.setFormatter(logging.Formatter(FORMAT))
    out.addHandler(console)
    out.addHandler(full)
    return out


def relay_ctrl_c() -> None:
    """Take Ctrl-C in this process only. A terminal sends SIGINT to its whole foreground process
    group, so the helpers Dagster starts to mirror a step's output (`tail -F` and its
    `watch_orphans.py` watcher) would each die printing a KeyboardInterrupt traceback over the
    summary. SIGINT is blocked here, a mask every child inherits, and a thread takes it with
    `sigwait` and raises it in the main thread as if it had arrived there (Dagster's own interrupt
    handling then ends the run). For the command-line entry points only: call it first, before
    any other thread starts."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

    def relay() -> None:
        while True:
            signal.sigwait({signal.SIGINT})
            _thread.interrupt_main(signal.SIGINT)

    threading.Thread(target=relay, name="ctrl-c", daemon=True).start()
