"""[AdaLN] (adaptive_norm, adaLN-Zero) on the default data, 3 seeds, beside the committed Table 1 (issue 89).

A project of its own under --workdir (studies/project.py) runs the pipeline's stages through the CLI with params.yaml
as committed: ingest -> validate -> features -> baseline, then `contextual-bert train` and `evaluate` of the model of
settings.yaml for each seed, one at a time, then its check runs (committed rows retrained by the same code). A run
whose evaluation is there is not run again; a killed training resumes from its last.pt (the loop's exact resume).
Each finished run goes to results.json at once (`<run>/eval`); then the row and its comparison with the committed
rows (reports/eval/<model>-s<seed>.json) by Table 1's rule (`row`, `vs/<model>`, `check/<run>`).

    python studies/adaptive_norm/adaptive_norm.py --workdir /tmp/adaln [--no-checks]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import Project, record, relocated  # noqa: E402

HERE = Path(__file__).resolve().parent
KEPT = ("cross_entropy", "recall@1", "recall@5", "recall@10", "fitb_easy", "fitb_hard", "outfit_dependence")


def run_once(project: Project, model: str, seed: int, out: Path) -> dict:
    """Train and evaluate (model, seed) unless its evaluation is there; its eval JSON. Recorded in `out`."""
    from contextual_bert.config import Config

    config = Config.model_validate(project.params)
    evaluation, trained = config.eval_path(f"{model}-s{seed}"), config.train_metrics_path(model, seed)
    if not (evaluation.exists() and trained.exists()):
        project.stage("train", "--model", model, "--seed", str(seed))
        project.stage("evaluate", "--model", model, "--seed", str(seed))
    result, train = json.loads(evaluation.read_text()), json.loads(trained.read_text())
    keys = ("epochs", "best_epoch", "best_val_cross_entropy", "converged", "stopped_early", "seconds", "bag_warmup")
    record(out, f"{model}-s{seed}/eval", {"test": {m: result["test"][m] for m in KEPT}} | {k: train[k] for k in keys})
    return result


def committed(model: str, seeds: list[int]) -> list[dict]:
    return [json.loads((REPO / "reports" / "eval" / f"{model}-s{seed}.json").read_text()) for seed in seeds]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--settings", type=Path, default=HERE / "settings.yaml")
    parser.add_argument("--out", type=Path, default=HERE / "results.json", help="the results file")
    parser.add_argument("--no-checks", action="store_true", help="leave out the check runs")
    args = parser.parse_args()
    settings = yaml.safe_load(args.settings.read_text())
    model, seeds = settings["model"], settings["seeds"]

    from contextual_bert.evaluation import compare_models, summarize_runs

    base = yaml.safe_load((REPO / "params.yaml").read_text())
    base["train"]["num_threads"] = settings["threads"]
    project = Project(args.workdir, relocated(base, args.workdir), settings["threads"])
    for stage in ("ingest", "validate", "features", "baseline"):
        project.stage(stage)
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    record(args.out, "settings", settings | {"commit": git.stdout.strip() or None, "stages_seconds": project.timings})

    ours = summarize_runs([run_once(project, model, seed, args.out) for seed in seeds])
    record(args.out, "row", {m: ours["test"][m] for m in KEPT} | {"parameters": ours["parameters"], "seeds": seeds})
    for other in settings["compare_with"]:
        theirs = summarize_runs(committed(other, seeds))
        record(args.out, f"vs/{other}", {
            metric: {"ours": ours["test"][metric], "theirs": theirs["test"][metric]}
            | compare_models(ours, theirs, metric, direction == "higher")
            | {"verdict": verdict(ours, theirs, metric, direction == "higher", compare_models)}
            for metric, direction in settings["metrics"].items()
        })  # fmt: skip
    for check_model, seed in [] if args.no_checks else settings["check_runs"]:
        here = run_once(project, check_model, seed, args.out)["test"]["cross_entropy"]
        there = committed(check_model, [seed])[0]["test"]["cross_entropy"]
        record(args.out, f"check/{check_model}-s{seed}", {"here": here, "committed": there,
                                                           "same": abs(here - there) < 1e-9})  # fmt: skip
    return 0


def verdict(ours: dict, theirs: dict, metric: str, higher_is_better: bool, compare_models) -> str:
    """better / worse beyond the SE of the difference, else level (Table 1's rule, from either side)."""
    if compare_models(ours, theirs, metric, higher_is_better)["beats_by_more_than_se"]:
        return "better"
    if compare_models(theirs, ours, metric, higher_is_better)["beats_by_more_than_se"]:
        return "worse"
    return "level"


if __name__ == "__main__":
    raise SystemExit(main())
