"""Reward fuzzer (issue 21): thousands of wrong answers per family, scored by the training reward.

    .venv/bin/python benchmarks/reward_fuzz.py --attempts 100000 [--families arithmetic,search,code] [--seed 0]
        [--seconds S] [--variants profile,strip_units[,token_f1]] [--json benchmarks/results/reward-fuzz.json]

For each family, named attack classes (benchmarks/fuzz_attacks/) generate answers and programs
from a grammar and from mutations of the teacher's demonstrations, on real tasks of the family's
generator. Each distinct (candidate, task) pair is scored exactly as training scores it: the
profile's `reward` config, `verifiers.cascade.Cascade` on the profile's sandbox (bubblewrap, the
limits `SandboxResource` builds), `Candidate(policy_turns, num_policy_tokens, tools)` through
`score_many`. The outcome is compared with a ground truth that does not use the verifier under
test (wrong by construction, a family oracle, or differential testing for code):

    rewarded wrong    outcome > truth: the finding this tool exists for (exit status 1)
    escaped           outcome None for a wrong answer (truth < 1): a group with an unscorable member
                      never trains, so the answer escapes its 0; a finding like rewarded wrong
    slow              one scoring took longer than --slow-seconds (aborted at --hang-seconds)
    false negative    outcome < truth: a right answer under-rewarded (information)
    unscorable        outcome None (escaped ones included); not judged: truth None, both counted

`--variants` scores every arithmetic/search attempt again under reward configs users can pick:
strip_units (math with `strip_units: true`) and token_f1 (search scored by token F1). Prints
progress, a markdown table per family and class, and writes JSON + markdown (--json, .md beside).
docs/reward-fuzz.md has the classes, how to read the report, and the full run's figures.
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import hashlib
import json
import math
import platform
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchmarks.fuzz_attacks.arithmetic  # noqa: E402, F401  (each family's module registers its attack classes)
import benchmarks.fuzz_attacks.code  # noqa: E402, F401
import benchmarks.fuzz_attacks.search  # noqa: E402, F401
import benchmarks.fuzz_attacks.unscorable  # noqa: E402, F401  (every family's `unscorable` class)
from benchmarks.fuzz_attacks import ATTACKS, AttackClass, Attempt, World  # noqa: E402
from configs import FlywheelConfig, load_profile  # noqa: E402
from environments import families  # noqa: E402
from environments.base import task_view  # noqa: E402
from environments.family import tools_of  # noqa: E402
from verifiers.base import get_verifier  # noqa: E402
from verifiers.cascade import Cascade  # noqa: E402
from verifiers.code_tests import DEFAULT_GROUPS  # noqa: E402
from verifiers.shaping import Candidate  # noqa: E402

FAMILIES = ("arithmetic", "search", "code")
# Reward configs users can pick: name -> (the family it changes, None for all; profile overrides).
VARIANTS = {
    "profile": (None, {}),
    "strip_units": ("arithmetic", {"reward.verifiers.arithmetic.params.strip_units": True}),
    "token_f1": ("search", {"reward.verifiers.search.name": "token_f1"}),
}
EPS = 1e-9
MAX_MISSES = 500  # consecutive duplicates (or declined draws) before a class counts as exhausted
WARMUP = {
    "arithmetic": ["<answer>2*sqrt(2)</answer>", "<answer>log(3)</answer>", "<answer>1</answer>"],
    "search": ["<answer>x</answer>"],
    "code": ["<answer>def f(x):\n    return x</answer>"],
}


@dataclass
class FuzzConfig:
    profile: str = "tiny"
    families: tuple[str, ...] = FAMILIES
    attempts: int = 100_000  # distinct (candidate, task) pairs per family
    seconds: float = math.inf  # per family: generation stops when it runs out
    seed: int = 0
    tasks: int = 500  # tasks per family, from the family's generator
    variants: tuple[str, ...] = ("profile", "strip_units")
    classes: tuple[str, ...] = ()  # "family/name" filter; empty: all
    min_per_class: int = 1  # round-robin first, so every class runs even on a tiny budget
    slow_seconds: float = 2.0
    hang_seconds: float = 10.0
    max_slow_per_class: int = 3  # a class that keeps hanging stops: each costs the whole hang budget
    batch: int = 64
    examples: int = 3
    progress_s: float = 15.0
    quiet: bool = False


@dataclass
class Tally:
    """One attack class (or family) under one reward variant."""

    scored: int = 0
    rewarded_wrong: int = 0
    escaped: int = 0  # a wrong answer (truth < 1) scored unscorable: it escapes its 0
    false_negatives: int = 0
    unscorable: int = 0
    slow: int = 0
    not_judged: int = 0
    not_judged_rewarded: int = 0

    def add(self, other: "Tally") -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


@dataclass
class ClassReport:
    family: str
    name: str
    doc: str
    known: int | None
    attempts: int = 0
    misses: int = 0  # duplicates and declined draws
    slow_attempts: int = 0  # attempts slow under any variant
    exhausted: bool = False
    tallies: dict[str, Tally] = field(default_factory=dict)
    examples: list[dict] = field(default_factory=list)
    streak: int = 0  # consecutive misses


@dataclass
class FamilyReport:
    family: str
    tasks: int
    variants: list[str]
    classes: dict[str, ClassReport]
    seconds: float = 0.0
    stopped_by: str = "attempts"

    @property
    def attempts(self) -> int:
        return sum(c.attempts for c in self.classes.values())

    def total(self, variant: str) -> Tally:
        total = Tally()
        for c in self.classes.values():
            total.add(c.tallies[variant])
        return total


@dataclass(frozen=True)
class Scored:
    outcome: float | None
    reward: float
    details: str
    seconds: float
    aborted: bool = False


# --- scoring, as training does it --------------------------------------------------------------------


class Overrun(BaseException):
    """Raised in the main thread when one scoring call runs past the hang limit (a BaseException:
    `run_verifier` turns every Exception into an unscorable verdict)."""


class Watchdog:
    """Aborts an in-process scoring call that runs past `limit_s`: a thread notices, and delivers
    SIGUSR1 to the main thread, whose handler raises `Overrun`. Off outside the main thread."""

    def __init__(self, limit_s: float):
        self.limit_s, self.started = limit_s, None
        self.enabled = threading.current_thread() is threading.main_thread()
        self._stop = threading.Event()

    def __enter__(self) -> "Watchdog":
        if self.enabled:
            self._previous = signal.signal(signal.SIGUSR1, self._raise)
            self._thread = threading.Thread(target=self._watch, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._stop.set()
            self._thread.join()
            signal.signal(signal.SIGUSR1, self._previous)

    def _overdue(self) -> bool:
        started = self.started
        return started is not None and time.monotonic() - started > self.limit_s

    def _raise(self, signum, frame) -> None:
        if self._overdue():
            raise Overrun

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            if self._overdue():
                _thread.interrupt_main(signal.SIGUSR1)
                self._stop.wait(1.0)

    @contextlib.contextmanager
    def timing(self):
        self.started = time.monotonic()
        try:
            yield
        finally:
            self.started = None


def _reset_after_overrun() -> None:
    """An abort can land inside the symbolic verifier's child-process call (verifiers.bounded, where
    it exists): close that child, so the next call does not read this call's late reply."""
    try:
        from verifiers.bounded import runner
    except ImportError:
        return
    runner().close()


@dataclass
class Scorer:
    variant: str
    cascade: Cascade
    inline: bool  # verified in this process (math, EM): scored one at a time under the watchdog
    watchdog: Watchdog

    def score(self, items: list[tuple[Candidate, dict]], keys: list[str]) -> list[Scored]:
        if not self.inline:  # the sandbox bounds each call; batches keep its pool busy
            start = time.perf_counter()
            done = self.cascade.score_many(items, keys)
            each = (time.perf_counter() - start) / max(len(items), 1)
            return [Scored(b.outcome, b.reward, b.details.get("outcome", ""), each) for b in done]
        out = []
        for item, key in zip(items, keys):
            start = time.perf_counter()
            try:
                with self.watchdog.timing():
                    b = self.cascade.score_many([item], [key])[0]
                out.append(Scored(b.outcome, b.reward, b.details.get("outcome", ""), time.perf_counter() - start))
            except Overrun:
                _reset_after_overrun()
                out.append(
                    Scored(None, 0.0, f"aborted after {self.watchdog.limit_s:g} s", time.perf_counter() - start, True)
                )
        return out


def variant_config(profile: str, variant: str) -> FlywheelConfig:
    return load_profile(profile, VARIANTS[variant][1])


def scorers_for(family: str, fc: FuzzConfig, sandbox, watchdog: Watchdog) -> list[Scorer]:
    out = []
    for variant in fc.variants:
        target = VARIANTS[variant][0]
        if target not in (None, family):
            continue
        cfg = variant_config(fc.profile, variant)
        spec = cfg.reward.verifiers[family]
        out.append(
            Scorer(
                variant,
                Cascade(cfg.reward, sandbox, concurrency=cfg.sandbox.pool_size),
                not get_verifier(spec.name).needs_sandbox,
                watchdog,
            )
        )
    return out


# --- the world of a family ---------------------------------------------------------------------------


def build_world(
    family: str, cfg: FlywheelConfig, n_tasks: int, seed: int, exclude_ids: frozenset[str] = frozenset()
) -> World:
    """Tasks of the family's generator (the profile's levels and knowledge base) and the teacher's
    demonstrations of them, detours included: the realistic trajectories mutations start from.
    `exclude_ids`: tasks a model under test was trained on (benchmarks/judge_agreement.py)."""
    kb = families.make_kb(cfg.data.knowledge_base, cfg.data.seed) if family == "search" else None
    fam = cfg.data.families.get(family)
    rows = families.generate_tasks(
        family, n_tasks, seed=seed, split="train", levels=fam.levels if fam else None, kb=kb, exclude_ids=exclude_ids
    )
    demos = list(families.demonstrations(family, rows, 3 * len(rows), seed=seed, teacher=cfg.teacher, kb=kb))
    demos = families.with_detours(family, demos, {t["task_id"]: t for t in rows}, cfg.teacher, seed=seed, kb=kb)
    by_task = defaultdict(list)
    for demo in demos:
        by_task[demo.task_id].append(demo)
    world = World(family, [task_view(t) for t in rows], dict(by_task), kb)
    if family == "code":
        params = cfg.reward.verifiers["code"].params
        world.cache["groups"] = tuple(params.get("groups", DEFAULT_GROUPS))
        world.cache["all_or_nothing"] = params.get("mode", "fraction") == "all_or_nothing"
    return world


# --- the loop ----------------------------------------------------------------------------------------


def _record(entry: ClassReport, variant: str, attempt: Attempt, task: dict, scored: Scored, fc: FuzzConfig) -> bool:
    """Counts one scoring against the truth; whether it was slow."""
    tally = entry.tallies[variant]
    tally.scored += 1
    kinds = []
    if scored.aborted or scored.seconds > fc.slow_seconds:
        tally.slow += 1
        kinds.append("slow")
    if scored.outcome is None:
        tally.unscorable += 1
        if attempt.truth is not None and attempt.truth < 1 - EPS and not scored.aborted:
            tally.escaped += 1
            kinds.append("escaped")
    elif attempt.truth is None:
        tally.not_judged += 1
        tally.not_judged_rewarded += scored.outcome > 0
    elif scored.outcome > attempt.truth + EPS:
        tally.rewarded_wrong += 1
        kinds.append("rewarded_wrong")
    elif scored.outcome < attempt.truth - EPS:
        tally.false_negatives += 1
        kinds.append("false_negative")
    for kind in kinds:
        if sum(e["kind"] == kind and e["variant"] == variant for e in entry.examples) < fc.examples:
            entry.examples.append(
                {
                    "kind": kind,
                    "variant": variant,
                    "task_id": task["task_id"],
                    "prompt": task["prompt"].strip(),
                    "gold": str(task["answer"])[:200],
                    "turns": [t[:600] for t in attempt.turns],
                    "truth": attempt.truth,
                    "outcome": scored.outcome,
                    "reward": round(scored.reward, 4),
                    "details": scored.details[:300],
                    "note": attempt.note,
                    "seconds": round(scored.seconds, 3),
                }
            )
    return "slow" in kinds


def _score_pending(pending: list, report: FamilyReport, scorers: list[Scorer], fc: FuzzConfig) -> None:
    if not pending:
        return
    tools = tools_of(report.family)
    items = [(Candidate(list(a.turns), sum(map(len, a.turns)) // 4 + 1, tools), task) for _, task, a, _ in pending]
    keys = [key for *_, key in pending]
    slow = [False] * len(pending)
    for scorer in scorers:
        for i, ((cls, task, attempt, _), scored) in enumerate(zip(pending, scorer.score(items, keys))):
            slow[i] |= _record(report.classes[cls.name], scorer.variant, attempt, task, scored, fc)
    for (cls, *_), was_slow in zip(pending, slow):
        report.classes[cls.name].slow_attempts += was_slow
    pending.clear()


def _next_class(
    active: dict[str, AttackClass], report: FamilyReport, fc: FuzzConfig, rng: random.Random
) -> AttackClass:
    behind = [c for c in active.values() if report.classes[c.name].attempts < fc.min_per_class]
    if behind:
        return behind[0]
    classes = list(active.values())
    return rng.choices(classes, [c.weight for c in classes])[0]


def fuzz_family(world: World, classes: list[AttackClass], scorers: list[Scorer], fc: FuzzConfig) -> FamilyReport:
    family, rng = world.family, random.Random(f"{fc.seed}/{world.family}")
    variants = [s.variant for s in scorers]
    report = FamilyReport(
        family,
        len(world.tasks),
        variants,
        {c.name: ClassReport(family, c.name, c.doc, c.known, tallies={v: Tally() for v in variants}) for c in classes},
    )
    active = {c.name: c for c in classes}
    seen: set[bytes] = set()
    pending: list = []
    start = last_log = time.monotonic()
    report.stopped_by = "attempts"
    while report.attempts < fc.attempts:
        if time.monotonic() - start > fc.seconds:
            report.stopped_by = "seconds"
            break
        if not active:
            report.stopped_by = "classes exhausted"
            break
        cls = _next_class(active, report, fc, rng)
        entry, task = report.classes[cls.name], rng.choice(world.tasks)
        attempt = cls.generate(task, world, rng)
        key = (
            None
            if attempt is None
            else hashlib.blake2b("\x00".join((task["task_id"], *attempt.turns)).encode(), digest_size=16).digest()
        )
        if attempt is None or key in seen:
            entry.misses, entry.streak = entry.misses + 1, entry.streak + 1
            if entry.streak >= MAX_MISSES:
                entry.exhausted = True
                del active[cls.name]
            continue
        entry.streak, entry.attempts = 0, entry.attempts + 1  # counted now: all pending attempts get scored
        seen.add(key)
        pending.append((cls, task, attempt, key.hex()))
        if len(pending) >= fc.batch or any(s.inline for s in scorers):
            _score_pending(pending, report, scorers, fc)
            if entry.slow_attempts >= fc.max_slow_per_class and cls.name in active:
                entry.exhausted = True  # each further attempt would cost the whole hang budget
                del active[cls.name]
        if not fc.quiet and time.monotonic() - last_log > fc.progress_s:
            last_log = time.monotonic()
            _progress(report, time.monotonic() - start)
    _score_pending(pending, report, scorers, fc)
    report.seconds = time.monotonic() - start
    if not fc.quiet:
        _progress(report, report.seconds)
    return report


def _progress(report: FamilyReport, seconds: float) -> None:
    found = ", ".join(
        f"{v}: {report.total(v).rewarded_wrong} rewarded wrong, {report.total(v).escaped} escaped, {report.total(v).slow} slow"
        for v in report.variants
    )
    print(
        f"[{report.family}] {report.attempts} attempts in {seconds:.0f} s ({report.attempts / max(seconds, 1e-9):.0f}/s); {found}",
        flush=True,
    )


def select_classes(family: str, patterns: tuple[str, ...]) -> list[AttackClass]:
    classes = list(ATTACKS[family].values())
    if not patterns:
        return classes
    wanted = [p.split("/", 1) for p in patterns]
    return [c for c in classes if any(f == family and n in ("*", c.name) for f, n in wanted)]


def run_fuzz(fc: FuzzConfig) -> list[FamilyReport]:
    """Fuzz every family of `fc` with the profile's reward (and the variants); the reports."""
    unknown = [v for v in fc.variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    cfg = load_profile(fc.profile)
    reports = []
    with contextlib.ExitStack() as stack:
        sandbox = None
        if "code" in fc.families:
            from assets.resources import SandboxResource  # the resource training opens: same limits, same pool

            sandbox = stack.enter_context(SandboxResource.from_config(cfg.sandbox).open())
        watchdog = stack.enter_context(Watchdog(fc.hang_seconds))
        for family in fc.families:
            classes = select_classes(family, fc.classes)
            if not classes:
                continue
            world = build_world(family, cfg, fc.tasks, fc.seed)
            scorers = scorers_for(family, fc, sandbox, watchdog)
            for scorer in scorers:  # first calls import sympy, start workers: not the attempts' time
                scorer.score(
                    [(Candidate([w], 8, tools_of(family)), world.tasks[0]) for w in WARMUP[family]],
                    [f"warmup-{i}" for i in range(len(WARMUP[family]))],
                )
            reports.append(fuzz_family(world, classes, scorers, fc))
    return reports


def findings(reports: list[FamilyReport]) -> int:
    return sum(r.total(v).rewarded_wrong + r.total(v).escaped + r.total(v).slow for r in reports for v in r.variants)


# --- the report --------------------------------------------------------------------------------------


def _commit() -> dict:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def to_json(reports: list[FamilyReport], fc: FuzzConfig, argv: list[str]) -> dict:
    def klass(c: ClassReport) -> dict:
        return {
            "doc": c.doc,
            "known_hole": c.known,
            "attempts": c.attempts,
            "misses": c.misses,
            "exhausted": c.exhausted,
            "variants": {v: asdict(t) for v, t in c.tallies.items()},
            "examples": c.examples,
        }

    return {
        "command": " ".join(["benchmarks/reward_fuzz.py", *argv]),
        **_commit(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "config": {k: None if v == math.inf else v for k, v in asdict(fc).items() if k != "quiet"},
        "findings": findings(reports),
        "families": {
            r.family: {
                "tasks": r.tasks,
                "attempts": r.attempts,
                "seconds": round(r.seconds, 1),
                "attempts_per_s": round(r.attempts / max(r.seconds, 1e-9), 1),
                "stopped_by": r.stopped_by,
                "variants": {v: asdict(r.total(v)) for v in r.variants},
                "classes": {n: klass(c) for n, c in r.classes.items()},
            }
            for r in reports
        },
    }


def _cells(tallies: dict[str, Tally], variants: list[str], name: str) -> str:
    return " / ".join(str(getattr(tallies[v], name)) for v in variants)


def to_markdown(reports: list[FamilyReport], fc: FuzzConfig) -> str:
    commit = _commit()
    lines = [
        f"Reward fuzz: profile `{fc.profile}`, seed {fc.seed}, commit {commit['commit']}{' (dirty tree)' if commit['dirty'] else ''}.",
        "",
        "| family | variant | attempts | rewarded wrong | escaped | slow | false negatives | unscorable | not judged (rewarded) | attempts/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in reports:
        for v in r.variants:
            t = r.total(v)
            lines.append(
                f"| {r.family} | {v} | {r.attempts:,} | {t.rewarded_wrong} | {t.escaped} | {t.slow} | {t.false_negatives} | {t.unscorable} "
                f"| {t.not_judged} ({t.not_judged_rewarded}) | {r.attempts / max(r.seconds, 1e-9):,.0f} |"
            )
    for r in reports:
        order = " / ".join(r.variants)
        lines += [
            "",
            f"### {r.family} ({r.tasks} tasks, stopped by {r.stopped_by}; columns per variant: {order})",
            "",
            "| class | issue | what it attacks | attempts | rewarded wrong | escaped | slow | false negatives | unscorable |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for c in r.classes.values():
            known = f"#{c.known}" if c.known else ""
            lines.append(
                f"| `{c.name}`{' (exhausted)' if c.exhausted else ''} | {known} | {c.doc} | {c.attempts:,} "
                f"| {_cells(c.tallies, r.variants, 'rewarded_wrong')} | {_cells(c.tallies, r.variants, 'escaped')} "
                f"| {_cells(c.tallies, r.variants, 'slow')} "
                f"| {_cells(c.tallies, r.variants, 'false_negatives')} | {_cells(c.tallies, r.variants, 'unscorable')} |"
            )
    shown = [
        (r, c, e) for r in reports for c in r.classes.values() for e in c.examples if e["kind"] != "false_negative"
    ]
    if shown:
        lines += ["", "### Findings (first examples per class and variant)", ""]
        for r, c, e in shown:
            lines.append(
                f"- **{r.family}/{c.name}** [{e['variant']}] {e['kind']}: {e['prompt']!r} (gold {e['gold'][:60]!r}) "
                f"<- {e['turns']!r:.300}: outcome {e['outcome']}, truth {e['truth']}, {e['seconds']} s; {e['details'][:120]}"
            )
    return "\n".join(lines)


def class_table() -> str:
    """The registered attack classes (docs/reward-fuzz.md embeds this table: `--list`)."""
    lines = ["| family | class | issue | what it attacks |", "|---|---|---|---|"]
    for family in FAMILIES:
        for c in ATTACKS[family].values():
            lines.append(f"| {family} | `{c.name}` | {f'#{c.known}' if c.known else ''} | {c.doc} |")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> tuple[FuzzConfig, Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--attempts", type=int, default=100_000, help="distinct (candidate, task) pairs per family")
    parser.add_argument("--seconds", type=float, default=math.inf, help="per family: stop generating after this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", type=int, default=500, help="tasks per family")
    parser.add_argument(
        "--variants", default="profile,strip_units", help=f"reward configs to score with: {', '.join(VARIANTS)}"
    )
    parser.add_argument("--classes", default="", help="only these classes: family/name,... (family/* for all of one)")
    parser.add_argument("--slow-seconds", type=float, default=2.0)
    parser.add_argument("--hang-seconds", type=float, default=10.0)
    parser.add_argument("--examples", type=int, default=3, help="examples kept per class, variant and kind")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/reward-fuzz.json"))
    parser.add_argument("--list", action="store_true", help="print the attack classes as a markdown table and exit")
    args = parser.parse_args(argv)
    if args.list:
        print(class_table())
        parser.exit()
    fc = FuzzConfig(
        profile=args.profile,
        families=tuple(f for f in args.families.split(",") if f),
        attempts=args.attempts,
        seconds=args.seconds,
        seed=args.seed,
        tasks=args.tasks,
        variants=tuple(v for v in args.variants.split(",") if v),
        classes=tuple(c for c in args.classes.split(",") if c),
        slow_seconds=args.slow_seconds,
        hang_seconds=args.hang_seconds,
        examples=args.examples,
    )
    bad = [f for f in fc.families if f not in FAMILIES]
    if bad:
        parser.error(f"unknown families {bad}; known: {', '.join(FAMILIES)}")
    return fc, args.json


def main(argv: list[str]) -> int:
    fc, path = parse_args(argv)
    reports = run_fuzz(fc)
    markdown = to_markdown(reports, fc)
    print(markdown)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(reports, fc, argv), indent=1, ensure_ascii=False))
    path.with_suffix(".md").write_text(markdown + "\n")
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 1 if findings(reports) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
