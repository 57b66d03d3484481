#!/usr/bin/env bash
# `make lint`'s shell check: shellcheck on the shell scripts, and on every Makefile recipe as make
# would run it (`make -n`, with a home whose path holds a space), so an unquoted path in a recipe
# (`rm -rf $FLYWHEEL_HOME`) fails lint instead of deleting the wrong folders.
set -euo pipefail
cd "$(dirname "$0")/.."
shellcheck --severity=warning scripts/*.sh .ci/run
status=0
for target in $(sed -n 's/^\.PHONY: *//p' Makefile); do
    recipe=$(FLYWHEEL_HOME="/tmp/lint home/h" make -n --no-print-directory "$target" VERSION=1 ROUND=1 2>&1) || {
        echo "make -n $target failed: $recipe"
        status=1
        continue
    }
    # a recipe that expands the home itself ($(FLYWHEEL_HOME)) must quote it: split into words, each
    # must hold the whole path (`rm -rf /tmp/lint home/h` deletes /tmp/lint and ./home/h)
    if ! printf '%s\n' "$recipe" | python3 -c '
import shlex, sys
bad = [line for line in sys.stdin.read().replace("\\\n", " ").splitlines()
       if any("/tmp/lint" in word and "/tmp/lint home/h" not in word for word in shlex.split(line, comments=True))]
for line in bad:
    print("unquoted FLYWHEEL_HOME: " + line)
sys.exit(1 if bad else 0)'; then
        echo "^ in the recipe of make $target"
        status=1
    fi
    # each recipe line runs in its own shell; as one script they are checked the same way
    if ! printf '%s\n' "$recipe" | shellcheck --shell=bash --severity=info -; then
        echo "^ in the recipe of make $target"
        status=1
    fi
done
exit $status
