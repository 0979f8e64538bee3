"""Choose one setting of a model on validation, then compare the chosen run with another model on test.

Each candidate is one training of the same model in a project of its own (studies/project.py, e.g. one
learning_curve.py run per learning rate), all on the same data. The candidate with the lowest best validation
cross-entropy is chosen (test is never read for the choice); it is then compared with `--against` by the paired
bootstrap over the test outfits (bootstrap.py), which needs both projects to hold the same test split.

    python studies/learning_curve/choose_and_pair.py --model bag_of_items_context_attrs --candidates /work/runs/bagc-*/n150000 \
        --against global_state_attrs --against-project /work/runs/gs/n150000 --label learning_rate \
        --run result --plot curves.png

A project is a folder with the params.yaml its stages ran with; `--label` names the setting the candidates
differ in (per_model.<model>.<label>), read from each project's params.yaml.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from learning_curve import CONTEXT_FREE

from contextual_bert.config import base_model
from contextual_bert.evaluation import OUTFITS_KEY, paired_difference

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import record  # noqa: E402

METRICS = ("cross_entropy", "recall@5")
LOWER_IS_BETTER = {"cross_entropy": True, "recall@5": False}


def read_run(project: Path, model: str, seed: int, label: str | None) -> dict:
    """The training history, converged flag and test evaluation of one run of `model` in `project`."""
    run = f"{model}-s{seed}"
    params = yaml.safe_load((project / "params.yaml").read_text())
    models, evals = Path(params["paths"]["models_dir"]), Path(params["paths"]["reports_dir"]) / "eval"
    for path in (models / run / "curve.json", models / run / "metrics.json", evals / f"{run}.json"):
        if not path.is_file():
            raise SystemExit(f"{path}: missing (has {run} been trained and evaluated in {project}?)")
    history = json.loads((models / run / "curve.json").read_text())
    trained = json.loads((models / run / "metrics.json").read_text())  # the training's own best epoch
    best = next(epoch for epoch in history if epoch["epoch"] == trained["best_epoch"])
    evaluation = json.loads((evals / f"{run}.json").read_text())
    if evaluation.get(OUTFITS_KEY) is None:
        raise SystemExit(f"{evals / f'{run}.json'}: no per-outfit record ({OUTFITS_KEY}) to pair")
    setting = params.get("per_model", {}).get(model, {}).get(label) if label else None
    return {
        "project": str(project),
        "run": run,
        "model": model,
        "setting": {label: setting} if label else None,
        "best_val_cross_entropy": trained["best_val_cross_entropy"],
        "best_epoch": trained["best_epoch"],
        "train_cross_entropy_at_best": best.get("train_cross_entropy"),
        "epochs": trained["epochs"],
        "converged": trained.get("converged"),
        "test": {m: evaluation["test"][m] for m in METRICS},
        "val_curve": [round(epoch["val_cross_entropy"], 4) for epoch in history],
        "_record": evaluation[OUTFITS_KEY],
        "_params": params,
    }


def gap_to_optimum(run: dict) -> float | None:
    """Test cross-entropy minus the optimum's (planted data), with or without the context as the model reads it."""
    context_free = base_model(run["model"]) in CONTEXT_FREE
    evals = Path(run["_params"]["paths"]["reports_dir"]) / "eval"
    path = evals / f"optimum_{'no_context' if context_free else 'context'}.json"
    if not path.is_file() or not json.loads(path.read_text()).get("known", True):
        return None
    return run["test"]["cross_entropy"] - json.loads(path.read_text())["test"]["cross_entropy"]


def plot(candidates: list[dict], against: dict, out: Path) -> None:
    """Validation cross-entropy by epoch of every candidate and of the model compared with."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for run in candidates:
        label = ", ".join(f"{k} {v}" for k, v in (run["setting"] or {}).items()) or run["project"]
        ax.plot(range(1, run["epochs"] + 1), run["val_curve"], label=f"{run['run']} ({label})")
    ax.plot(range(1, against["epochs"] + 1), against["val_curve"], color="black", label=against["run"])
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation cross-entropy (nats)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the model the candidates train")
    parser.add_argument("--candidates", type=Path, nargs="+", required=True, help="its projects, one per setting")
    parser.add_argument("--against", required=True, help="the model to compare the choice with")
    parser.add_argument("--against-project", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", help="the per_model.<model> key the candidates differ in (e.g. learning_rate)")
    parser.add_argument("--run", required=True, help="the run's key in the results file")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).with_name("results.json"),
        help="the results file (default: the study's results.json)",
    )
    parser.add_argument("--plot", type=Path, help="a PNG of every run's validation curve")
    args = parser.parse_args()

    candidates = [read_run(project, args.model, args.seed, args.label) for project in args.candidates]
    chosen = min(candidates, key=lambda run: run["best_val_cross_entropy"])
    against = read_run(args.against_project, args.against, args.seed, None)
    for run in [*candidates, against]:
        run["gap_to_optimum"] = gap_to_optimum(run)
    paired = {}  # positive: `against` better (paired_difference gives the first's mean minus the second's)
    for metric in METRICS:
        first, second = (chosen, against) if LOWER_IS_BETTER[metric] else (against, chosen)
        paired[metric] = paired_difference(first["_record"], second["_record"], metric)
    result = {
        "chosen_on": "best validation cross-entropy",
        "chosen": chosen["run"] + f" in {chosen['project']}",
        "chosen_setting": chosen["setting"],
        "candidates": [{k: v for k, v in run.items() if not k.startswith("_")} for run in candidates],
        "against": {k: v for k, v in against.items() if not k.startswith("_")},
        "paired_test": {
            "what": f"{against['run']} against the chosen {chosen['run']}, positive: "
            f"{against['run']} better; paired bootstrap over the test outfits",
            **paired,
        },
    }
    record(args.out, args.run, result)
    if args.plot:
        plot(result["candidates"], result["against"], args.plot)
    print(
        json.dumps(
            {
                "chosen": result["chosen"],
                "setting": chosen["setting"],
                "paired": {m: (p["difference"], p["interval"]) for m, p in paired.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
