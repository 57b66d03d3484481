"""The profile FLYWHEEL_HOME's flywheel runs with (its flywheel.json), or nothing: the Makefile's
default PROFILE. Standard library only (it runs before set-up, with the system python3)."""

import json
import os
import sys
from pathlib import Path

home = os.environ.get("FLYWHEEL_HOME") or "./.flywheel"
try:
    print(json.loads((Path(home) / "flywheel.json").read_text())["profile"])
except (OSError, ValueError, KeyError, TypeError):
    sys.exit(0)
