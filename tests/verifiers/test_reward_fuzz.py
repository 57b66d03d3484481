"""The reward fuzzer on a small budget (issue 21): every attack class runs, through the training
reward, and none of its wrong answers is rewarded, unscorable (escaped its 0) or slow to score. The full run (100,000 attempts
per family) is `make fuzz`; docs/reward-fuzz.md has its figures."""

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.fuzz_attacks import ATTACKS  # noqa: E402
from benchmarks.reward_fuzz import FuzzConfig, run_fuzz  # noqa: E402

# ~15 s on a 2-core machine (arithmetic is scored twice: the profile's reward and strip_units;
# code goes through the bubblewrap sandbox), at most ~60 s: the seconds caps bound each family,
# and a class whose answers hang stops after its first slow attempt (2 variants x 3 s).
BUDGET = FuzzConfig(
    profile="tiny",
    seed=0,
    tasks=200,
    variants=("profile", "strip_units"),
    min_per_class=2,
    slow_seconds=2.0,
    hang_seconds=3.0,
    max_slow_per_class=1,
    examples=1,
    quiet=True,
)
ATTEMPTS = {"arithmetic": (20_000, 15.0), "search": (10_000, 5.0), "code": (400, 25.0)}


def _finding(family: str, cls, variant: str) -> str:
    example = next((e for e in cls.examples if e["variant"] == variant and e["kind"] != "false_negative"), {})
    t = cls.tallies[variant]
    return (
        f"{family}/{cls.name} [{variant}]: {t.rewarded_wrong} rewarded wrong, {t.escaped} escaped, {t.slow} slow "
        f"of {cls.attempts}; "
        f"e.g. {example.get('turns', [''])[-1][:160]!r} for {example.get('prompt')!r} -> outcome {example.get('outcome')} "
        f"({example.get('details', '')[:80]})"
    )


@pytest.mark.integrity
@pytest.mark.parametrize("family", sorted(ATTEMPTS))
def test_no_wrong_answer_is_rewarded(family):
    if family == "code" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/setup.sh installs it)")
    attempts, seconds = ATTEMPTS[family]
    (report,) = run_fuzz(replace(BUDGET, families=(family,), attempts=attempts, seconds=seconds))

    assert report.attempts >= min(attempts, 100), f"only {report.attempts} attempts ran"
    idle = [name for name, cls in report.classes.items() if cls.attempts == 0]
    assert not idle and set(report.classes) == set(ATTACKS[family]), f"attack classes without attempts: {idle}"
    found = [
        _finding(family, cls, v)
        for cls in report.classes.values()
        for v in report.variants
        if cls.tallies[v].rewarded_wrong or cls.tallies[v].escaped or cls.tallies[v].slow
    ]
    assert not found, "wrong answers rewarded, unscorable (escaped) or slow to score:\n" + "\n".join(found)
