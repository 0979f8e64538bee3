"""Choose one setting of a model on validation, then compare the chosen run with another model on test.

Each candidate is one training of the same model in a project of its own (benchmarks/project.py, e.g. one
learning_curve.py run per learning rate), all on the same data. The candidate with the lowest best validation
cross-entropy is chosen (test is never read for the choice); it is then compared with `--against` by the paired
bootstrap over the test outfits (bootstrap.py), which needs both projects to hold the same test split.

    python benchmarks/choose_and_pair.py \
        --candidates /work/runs/bagc-*/n150000:bag_of_items_context_attrs \
        --against /work/runs/gs/n150000:global_state_attrs --label rate --out result.json

A candidate is PROJECT:RUN, RUN a model name (seed 0) or a "<model>-s<seed>" run name; `--label` names the
params key told apart (variants.<model>.<label>), read from each project's params.yaml.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from contextual_bert.bootstrap import OUTFITS_KEY, paired_difference
from contextual_bert.config import base_model

METRICS = ("cross_entropy", "recall@5")
LOWER_IS_BETTER = {"cross_entropy": True, "recall@5": False}


def read_run(spec: str, label: str | None) -> dict:
    """The training history, converged flag and test evaluation of PROJECT:RUN."""
    project, _, run = spec.rpartition(":")
    run = run if "-s" in run else f"{run}-s0"
    model = run.rpartition("-s")[0]
    params = yaml.safe_load((Path(project) / "params.yaml").read_text())
    models, evals = Path(params["paths"]["models_dir"]), Path(params["paths"]["reports_dir"]) / "eval"
    history = json.loads((models / run / "history.json").read_text())
    best = min(history, key=lambda epoch: epoch["val_cross_entropy"])
    evaluation = json.loads((evals / f"{run}.json").read_text())
    if evaluation.get(OUTFITS_KEY) is None:
        raise SystemExit(f"{evals / f'{run}.json'}: no per-outfit record ({OUTFITS_KEY}) to pair")
    setting = params.get("variants", {}).get(model, {}).get(label) if label else None
    return {
        "project": project, "run": run, "setting": {label: setting} if label else None,
        "best_val_cross_entropy": best["val_cross_entropy"], "best_epoch": best["epoch"],
        "train_cross_entropy_at_best": best.get("train_cross_entropy"), "epochs": len(history),
        "converged": json.loads((models / run / "metrics.json").read_text()).get("converged"),
        "test": {m: evaluation["test"][m] for m in METRICS},
        "val_curve": [round(epoch["val_cross_entropy"], 4) for epoch in history],
        "_record": evaluation[OUTFITS_KEY],
    }


def gap_to_optimum(spec: str, run: dict) -> float | None:
    """Test cross-entropy minus the optimum's (planted data), with or without the context as the model reads it."""
    params = yaml.safe_load((Path(spec.rpartition(":")[0]) / "params.yaml").read_text())
    context_free = base_model(run["run"].rpartition("-s")[0]) in ("none", "bag_of_items")
    path = Path(params["paths"]["reports_dir"]) / "eval" / f"optimum_{'no_context' if context_free else 'context'}.json"
    if not path.is_file() or not json.loads(path.read_text()).get("known", True):
        return None
    return run["test"]["cross_entropy"] - json.loads(path.read_text())["test"]["cross_entropy"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", nargs="+", required=True, help="PROJECT:RUN, one per setting")
    parser.add_argument("--against", required=True, help="PROJECT:RUN of the model to compare the choice with")
    parser.add_argument("--label", help="the variants.<model> key the candidates differ in (e.g. learning_rate)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    candidates = {spec: read_run(spec, args.label) for spec in args.candidates}
    chosen_spec = min(candidates, key=lambda spec: candidates[spec]["best_val_cross_entropy"])
    chosen, against = candidates[chosen_spec], read_run(args.against, None)
    for spec, run in [*candidates.items(), (args.against, against)]:
        run["gap_to_optimum"] = gap_to_optimum(spec, run)
    paired = {}  # positive: `against` better
    for metric in METRICS:
        worse_first = (chosen, against) if LOWER_IS_BETTER[metric] else (against, chosen)
        paired[metric] = paired_difference(worse_first[0]["_record"], worse_first[1]["_record"], metric)
    result = {
        "chosen_on": "best validation cross-entropy", "chosen": chosen["run"] + f" in {chosen['project']}",
        "chosen_setting": chosen["setting"],
        "candidates": [{k: v for k, v in run.items() if k != "_record"} for run in candidates.values()],
        "against": {k: v for k, v in against.items() if k != "_record"},
        "paired_test": {"what": f"{against['run']} against the chosen {chosen['run']}, positive: "
                                f"{against['run']} better; paired bootstrap over the test outfits", **paired},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({"chosen": result["chosen"], "setting": chosen["setting"],
                      "paired": {m: (p["difference"], p["interval"]) for m, p in paired.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
