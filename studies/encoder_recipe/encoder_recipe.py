"""Issue 45: which training recipe makes the encoder learn from the outfit's other articles, on weak-signal
(planted, hidden tastes) and strong-signal (the default synthetic) data alike.

One data project per data kind (`--kind planted_hidden|default`) under --workdir: ingest -> validate ->
features -> baseline -> optimum, through the pipeline's own CLI (studies/project.py). Then, per recipe,
a project of its own that reads that data (its paths point at the data project's raw / validated / features
folders) and trains + evaluates each model, one seed, one torch thread, --jobs at a time:

    old        params.yaml's recipe as it was before issue 45 (random start, no bag path)
    bag        model.bag_path: input, the mean of the other articles' input vectors added at every position
    outbag     model.bag_path: output, the mean of the other articles' (tied) vectors added to the head state
    outbag_wd  outbag with weight decay 0.1 (the old recipe: 0.01): does it fit the training outfits less?
    outbag_wd3, outbag_wd1   the same with weight decay 0.3, 1.0
    wd3        weight decay 0.3 alone (no bag path, no warm-up)
    warmup     weight decay 0.3 and train.bag_warmup_epochs 2: the bag state in the head state for the first two
               epochs (weight 1, 0.5), then the paper's model
    checked    the warm-up only for an encoder still stuck after 400 steps (train.bag_warmup_check_steps: the
               outfit dependence on validation under ranking.STUCK_BELOW), from the next epoch on
    checked_ids  checked, with no id dropout (`_attrs` models only: per_model.<model>_attrs.id_dropout 0)
    checked_ids05  checked, with id dropout 0.05 (`_attrs` models only)
    cooc       train.init_embeddings: cooccurrence (the article ids start at the factorised PPMI)
    bag_cooc, outbag_cooc   a bag path and the co-occurrence start

Every row holds the validation and test cross-entropy, recall@5, the outfit dependence (evaluation.py: the
cross-entropy with the encoder reading another outfit's articles, minus the real one), convergence, and the
paired bootstrap of the test cross-entropy against the bag of items (models of ids) or the attribute-aware
popularity (models with attributes). The recipe is chosen on validation; test only pairs.

    python studies/encoder_recipe/encoder_recipe.py --kind planted_hidden --size 20000 --recipes old bag \
        --models none none_attrs --yardsticks bag_of_items --jobs 2 --run x
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from contextual_bert.config import uses_attributes  # noqa: E402
from contextual_bert.evaluation import OUTFITS_KEY, paired_difference  # noqa: E402
from studies.project import Project, record, relocated  # noqa: E402

# the hidden-taste planted data: the tastes carried by a hidden style alone (no column says it)
HIDDEN = {"taste_strength": 0.0, "hidden_taste_strength": 1.3}
RECIPES = {
    "old": {
        "model": {"bag_path": "none"},
        "variant": {"init_embeddings": "random", "weight_decay": 0.01, "bag_warmup_epochs": 0},
    },
    "bag": {"model": {"bag_path": "input"}, "variant": {"init_embeddings": "random", "bag_warmup_epochs": 0}},
    "outbag": {"model": {"bag_path": "output"}, "variant": {"init_embeddings": "random"}},
    "outbag_wd": {"model": {"bag_path": "output"}, "variant": {"init_embeddings": "random", "weight_decay": 0.1}},
    "outbag_wd3": {"model": {"bag_path": "output"}, "variant": {"init_embeddings": "random", "weight_decay": 0.3}},
    "outbag_wd1": {"model": {"bag_path": "output"}, "variant": {"init_embeddings": "random", "weight_decay": 1.0}},
    "wd3": {
        "model": {"bag_path": "none"},
        "variant": {"init_embeddings": "random", "weight_decay": 0.3, "bag_warmup_epochs": 0},
    },
    "warmup": {
        "model": {"bag_path": "none"},
        "variant": {"init_embeddings": "random", "weight_decay": 0.3, "bag_warmup_epochs": 2},
    },
    "checked": {
        "model": {"bag_path": "none"},
        "variant": {
            "init_embeddings": "random",
            "weight_decay": 0.3,
            "bag_warmup_epochs": 2,
            "bag_warmup_check_steps": 400,
        },
    },
    "cooc": {"model": {"bag_path": "none"}, "variant": {"init_embeddings": "cooccurrence", "bag_warmup_epochs": 0}},
    "bag_cooc": {
        "model": {"bag_path": "input"},
        "variant": {"init_embeddings": "cooccurrence", "bag_warmup_epochs": 0},
    },
    "outbag_cooc": {"model": {"bag_path": "output"}, "variant": {"init_embeddings": "cooccurrence"}},
}
# the checked recipe with a fixed id dropout (the `_attrs` models only)
for name, rate in (("checked_ids", 0.0), ("checked_ids05", 0.05)):
    RECIPES[name] = {
        "model": RECIPES["checked"]["model"],
        "variant": {**RECIPES["checked"]["variant"], "id_dropout": rate},
    }
DATA_DIRS = ("raw_dir", "validated_dir", "quarantine_dir", "features_dir", "source_fingerprint")


def data_params(base: dict, root: Path, kind: str, size: int, threads: int) -> dict:
    params = relocated(base, root)
    if kind == "planted_hidden":
        params["ingest"]["source"] = "planted"
        params["planted"].update(n_outfits=size, **HIDDEN)
    elif kind == "default":
        params["ingest"]["source"] = "synthetic"
        params["generate"]["size"] = "default"
    else:
        raise SystemExit(f"unknown --kind {kind}")
    params["train"].update(seeds=[0], num_threads=threads)
    return params


def recipe_params(base: dict, data: dict, root: Path, recipe: str, models: list[str], max_epochs: int | None) -> dict:
    """The data project's params (`data`), its data folders kept, models / reports / MLflow under `root`."""
    params = json.loads(json.dumps(data))
    mine = relocated(base, root)
    params["paths"] = {k: data["paths"][k] if k in DATA_DIRS else mine["paths"][k] for k in base["paths"]}
    params["mlflow"]["tracking_uri"] = mine["mlflow"]["tracking_uri"]
    params["model"].update(RECIPES[recipe]["model"])
    params["train"]["models"] = models
    if max_epochs is not None:
        params["train"]["max_epochs"] = max_epochs
    for model in models:
        overrides = params["per_model"].setdefault(model, {})
        if not model.startswith("bag_of_items"):
            overrides.update(RECIPES[recipe]["variant"])
    return params


def paired_ce(b: dict, a: dict) -> dict:
    """Test cross-entropy of b minus a's, paired over the test outfits (positive: a better)."""
    records = (b.get(OUTFITS_KEY), a.get(OUTFITS_KEY))
    return {"why": "no per-outfit record"} if None in records else paired_difference(*records, "cross_entropy")


def row(project: Project, model: str, seed: int = 0) -> dict:
    result = json.loads((project.path("reports_dir") / "eval" / f"{model}-s{seed}.json").read_text())
    trained = json.loads((project.path("models_dir") / f"{model}-s{seed}" / "metrics.json").read_text())
    keep = ("cross_entropy", "recall@1", "recall@5", "outfit_dependence")
    return {
        "val": {k: result["val"].get(k) for k in keep},
        "test": {k: result["test"].get(k) for k in keep},
        "converged": trained.get("converged"),
        "best_epoch": trained.get("best_epoch"),
        "epochs": trained.get("epochs"),
        "train_seconds": trained.get("seconds"),
        "_result": result,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", required=True, choices=["planted_hidden", "default"])
    parser.add_argument("--size", type=int, default=20_000, help="planted outfits (planted_hidden only)")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--models", nargs="+", default=["none"])
    parser.add_argument("--yardsticks", nargs="*", default=["bag_of_items"], help="trained once (recipe old)")
    parser.add_argument("--max-epochs", type=int, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/encoder_recipe"))
    parser.add_argument("--seed", type=int, default=0, help="the recipes' models' seed (the yardsticks: seed 0)")
    parser.add_argument("--run", required=True, help="the run's key in the results file")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).with_name("results.json"),
        help="the results file (default: the study's results.json)",
    )
    args = parser.parse_args()

    base = yaml.safe_load((REPO / "params.yaml").read_text())
    name = args.kind + (f"_{args.size}" if args.kind != "default" else "")
    data_root = args.workdir / name / "data"
    data = Project(data_root, data_params(base, data_root, args.kind, args.size, args.threads), args.threads)
    if not (data.path("features_dir") / "manifest.json").exists():
        for stage in ("ingest", "validate", "features", "baseline", "optimum"):
            data.stage(stage)
    evals = data.path("reports_dir") / "eval"
    references = {}
    for ref in ("popularity", "popularity_attribute", "optimum_no_context", "optimum_context"):
        path = evals / f"{ref}.json"
        if path.exists() and json.loads(path.read_text()).get("known") is not False:
            references[ref] = json.loads(path.read_text())

    started = time.perf_counter()
    runs: dict[tuple[str, str], Project] = {}
    jobs = []
    for model in args.yardsticks:  # at params.yaml's train.max_epochs, whatever --max-epochs says
        jobs.append(("old", model, args.workdir / name / "yardsticks", None))
    yardsticks = {("old", model) for model in args.yardsticks}
    budget = f"e{args.max_epochs or base['train']['max_epochs']}"
    for recipe in args.recipes:
        for model in args.models:
            jobs.append((recipe, model, args.workdir / name / budget / recipe / model, args.max_epochs))
    projects = []
    for recipe, model, root, max_epochs in jobs:
        project = Project(root, recipe_params(base, data.params, root, recipe, [model], max_epochs), args.threads)
        runs[(recipe, model)] = project
        seed = 0 if (recipe, model) in yardsticks else args.seed
        if not (project.path("reports_dir") / "eval" / f"{model}-s{seed}.json").exists():
            projects.append((project, model, seed))

    from concurrent.futures import ThreadPoolExecutor

    def one(item):
        project, model, seed = item
        project.train_and_evaluate([(model, seed)], jobs=1)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, projects))

    rows = {
        f"{recipe}/{model}": row(project, model, 0 if (recipe, model) in yardsticks else args.seed)
        for (recipe, model), project in runs.items()
    }
    for key, r in rows.items():
        model = key.split("/")[1]
        if uses_attributes(model) and "popularity_attribute" in references:
            r["test_vs_popularity_attribute"] = paired_ce(references["popularity_attribute"], r["_result"])
            if "optimum_no_context" in references:  # the share of the way from that popularity to the optimum
                r["share_to_optimum_no_context"] = {
                    split: (references["popularity_attribute"][split]["cross_entropy"] - r[split]["cross_entropy"])
                    / (
                        references["popularity_attribute"][split]["cross_entropy"]
                        - references["optimum_no_context"][split]["cross_entropy"]
                    )
                    for split in ("val", "test")
                }
        elif not model.startswith("bag_of_items") and "old/bag_of_items" in rows:
            r["test_vs_bag_of_items"] = paired_ce(rows["old/bag_of_items"]["_result"], r["_result"])
    out = {
        "kind": args.kind,
        "size": args.size if args.kind != "default" else None,
        "planted_hidden": HIDDEN if args.kind == "planted_hidden" else None,
        "rows_features": json.loads((data.path("features_dir") / "manifest.json").read_text()).get("rows"),
        "max_epochs": args.max_epochs or base["train"]["max_epochs"],
        "threads": args.threads,
        "jobs": args.jobs,
        "seed": args.seed,
        "references": {
            k: {
                "val": {m: v["val"].get(m) for m in ("cross_entropy", "recall@5")},
                "test": {m: v["test"].get(m) for m in ("cross_entropy", "recall@5")},
            }
            for k, v in references.items()
        },
        "runs": {k: {kk: vv for kk, vv in r.items() if kk != "_result"} for k, r in rows.items()},
        "seconds": round(time.perf_counter() - started, 1),
    }
    record(args.out, args.run, out)
    print(json.dumps({k: (v["val"]["cross_entropy"], v["val"]["outfit_dependence"]) for k, v in out["runs"].items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
