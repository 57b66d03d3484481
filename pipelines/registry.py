"""Model registry workflows from the command line (`make models`, `make promote`, `make rollback`).

    python -m pipelines.registry list                      # versions, scores, aliases
    python -m pipelines.registry promote VERSION [--force] # through the promotion gate
    python -m pipelines.registry rollback                  # champion -> the previous champion
    python -m pipelines.registry load [--alias champion] --out DIR  # the policy's HF folder

A version is an MLflow model: the agent (assets/agent_model.py), which `make serve`
(pipelines/serve.py) and `mlflow.pyfunc.load_model("models:/agentic-policy@champion")` run.

The registry is the profile's MLflow store (FLYWHEEL_HOME/mlflow.db by default). `promote` runs
the same gate as the benchmark asset: the paired CI of (version - champion) over the held-out
tasks must clear `benchmark.promotion_margin`, and a version whose round was blocked (collapse)
is refused too. `--force` overrides the gate and is recorded on the version (`promoted_by`).
A gated promotion is a compare-and-set: if the champion changes while the gate compares against
it (a round's benchmark promoting at the same moment), nothing moves and the command says so.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import yaml

from assets.locks import Busy
from assets.tracking import CHAMPION, ChampionChanged, MLflowTracker
from configs import ConfigError, FlywheelConfig, parse_override
from pipelines.home import HomeError, config_for, located
from training.evaluate import promotion_decision


class RegistryError(RuntimeError):
    """A registry command that cannot do what was asked; the message says why."""


def tracker_for(cfg: FlywheelConfig) -> MLflowTracker:
    from pipelines.resources import resources_for

    return resources_for(cfg)["tracker"]


def version_named(tracker: MLflowTracker, version: str):
    """The registered version `version`, or RegistryError naming the versions there are."""
    found = {str(v.version): v for v in tracker.versions()}
    if str(version) not in found:
        raise RegistryError(
            f"registered model {tracker.registered_model!r} has no version {version!r} (versions: {', '.join(found) or 'none'})"
        )
    return found[str(version)]


def gate(tracker: MLflowTracker, version: str, cfg: FlywheelConfig) -> dict:
    """The benchmark asset's promotion decision for `version` against the current champion."""
    candidate = version_named(tracker, version)
    champion = tracker.version_by_alias(CHAMPION)
    if champion is not None and str(champion.version) == str(candidate.version):
        raise RegistryError(f"version {version} is already the champion")
    if champion is not None and tracker.gate_k(candidate.run_id) != tracker.gate_k(champion.run_id):
        raise RegistryError(
            f"version {version} was scored with benchmark.gate_k={tracker.gate_k(candidate.run_id)} and the champion "
            f"(version {champion.version}) with {tracker.gate_k(champion.run_id)}: their per-task scores cannot be compared"
        )
    scores = tracker.load_json(candidate.run_id, "per_task_scores.json")
    champion_scores = tracker.load_json(champion.run_id, "per_task_scores.json") if champion else None
    decision = promotion_decision(scores, champion_scores, cfg.benchmark.confidence, cfg.benchmark.promotion_margin)
    return {
        **decision,
        "champion": str(champion.version) if champion else None,
        "blocked_by": candidate.tags.get("blocked_by", ""),
    }


def promote(tracker: MLflowTracker, version: str, cfg: FlywheelConfig, *, force: bool = False) -> str:
    """Promote through the gate; a refusal raises with the figures that decided it."""
    decision = gate(tracker, version, cfg)
    against = f"v{version} vs champion v{decision['champion']}"
    figures = (
        (
            f"{against}: pass@1 difference {decision['diff']:+.3f}, {cfg.benchmark.confidence:.0%} CI "
            f"[{decision['diff_ci_low']:+.3f}, {decision['diff_ci_high']:+.3f}]"
        )
        if decision["champion"]
        else f"v{version}: no champion yet"
    )
    reasons = []
    if not decision["promote"]:
        reasons.append(
            f"the CI lower bound {decision['diff_ci_low']:+.3f} is not above benchmark.promotion_margin {cfg.benchmark.promotion_margin:+.3f}"
        )
    if decision["blocked_by"]:
        reasons.append(f"its round was blocked ({decision['blocked_by']})")
    if reasons and not force:
        how = f"make promote VERSION={version} FORCE=1" if "MAKELEVEL" in os.environ else "pass --force"
        raise RegistryError(f"refused: {figures}; {' and '.join(reasons)}. To promote anyway: {how}.")
    try:  # gated: only over the champion the gate compared against; forced: over whoever holds it
        tracker.promote(
            version, "force" if reasons else "gate", **({} if reasons else {"expected": decision["champion"]})
        )
    except ChampionChanged as exc:
        raise RegistryError(
            f"refused: {exc}; run `promote {version}` again to compare it against the new champion"
        ) from None
    return (
        f"promoted v{version} to {CHAMPION}"
        + (f" (forced over: {'; '.join(reasons)})" if reasons else "")
        + f" -- {figures}"
    )


def load(tracker: MLflowTracker, alias: str, out: Path):
    """Download `models:/<name>@<alias>` and load its policy. A version is the agent model
    (assets/agent_model.py: the HF folder is its `artifacts/checkpoint`), or, registered before
    versions were MLflow models, the HF folder itself; both load."""
    import mlflow

    from training.model import load_policy, load_tokenizer

    tracker.client()  # sets the tracking URI
    uri = f"models:/{tracker.registered_model}@{alias}"
    out.mkdir(parents=True, exist_ok=True)
    try:
        folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(out)))
    except mlflow.exceptions.MlflowException as exc:
        raise RegistryError(f"cannot load {uri}: {exc.message}") from exc
    if (folder / "MLmodel").exists():  # the HF folder is the agent model's `checkpoint` artifact
        flavor = yaml.safe_load((folder / "MLmodel").read_text())["flavors"]["python_function"]
        folder = folder / flavor["artifacts"]["checkpoint"]["path"]
    return load_policy(folder), load_tokenizer(folder), folder


def _table(rows: list[dict]) -> str:
    lines = ["version  stage  round  pass@1  95% CI           aliases              promoted_by  blocked_by"]
    for r in rows:
        ci = f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if not math.isnan(r["ci_low"]) else ""
        lines.append(
            f"{r['version']:<8} {r['stage']:<6} {r['round']:<6} {r['pass_at_1']:.3f}   {ci:<16} {r['aliases']:<20} "
            f"{r['promoted_by']:<12} {r['blocked_by']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.registry", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="profile (default: the one this home's flywheel runs with, its overrides too; else FLYWHEEL_PROFILE or tiny)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="profile override, e.g. benchmark.promotion_margin=0.02",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="versions with their benchmark scores and aliases")
    p_promote = commands.add_parser("promote", help="make VERSION the champion if it passes the promotion gate")
    p_promote.add_argument("version")
    p_promote.add_argument(
        "--force", action="store_true", help="promote even if the gate refuses (recorded as promoted_by=force)"
    )
    commands.add_parser("rollback", help="give the champion alias back to the previous champion")
    p_load = commands.add_parser("load", help="download and load models:/<registered model>@ALIAS")
    p_load.add_argument("--alias", default=CHAMPION)
    p_load.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    # score downloads would print bars between our lines
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        located()  # a moved home's stored paths rewritten before MLflow reads them
        cfg = config_for(args.profile, dict(parse_override(item) for item in args.set))
        tracker = tracker_for(cfg)
        if args.command == "list":
            rows = tracker.version_rows()
            print(
                _table(rows)
                if rows
                else f"registered model {tracker.registered_model!r} has no versions yet (run `make run`)"
            )
        elif args.command == "promote":
            print(promote(tracker, args.version, cfg, force=args.force))
        elif args.command == "rollback":
            was, now = tracker.rollback()
            print(f"rolled back {CHAMPION}: v{was} -> v{now}")
        else:
            model, _, folder = load(tracker, args.alias, args.out)
            print(
                f"loaded models:/{tracker.registered_model}@{args.alias} from {folder}: {sum(p.numel() for p in model.parameters()):,} parameters"
            )
    except (RegistryError, LookupError, ConfigError, HomeError, Busy) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
