"""Learning curve on planted data: the gap of [None] and of a context variant to their Bayes optimum as the
number of outfits grows. If the gap does not shrink with more data, the training recipe is wrong.

For every size, a project of its own under --workdir (params.yaml's settings, `ingest.source: planted`,
`planted.n_outfits` = the size, paths inside the project) runs the pipeline's own stages through the CLI:
ingest -> validate -> features -> train + evaluate (each variant, one seed) -> baseline -> optimum. The
planted truth is the same at every size (same seed, catalogue and customers), so the optimum is comparable.

    python benchmarks/learning_curve.py --sizes 15000 50000 150000 --variants none global_state

Writes reports/learning_curve/learning_curve.json and learning_curve.png (and each size's Table 1 inputs stay
in its project). Training is the slow part: about 2,000-3,000 outfits/s per epoch on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CONTEXT_FREE = ("none", "bag_of_items")


def project_params(base: dict, root: Path, size: int, variants: list[str], seed: int, threads: int) -> dict:
    params = json.loads(json.dumps(base))  # a deep copy
    params["paths"] = {name: str(root / Path(value)) for name, value in base["paths"].items()}
    params["ingest"]["source"] = "planted"
    params.setdefault("planted", {})["n_outfits"] = size
    params["train"].update(variants=variants, seeds=[seed], num_threads=threads)
    params["mlflow"]["tracking_uri"] = f"sqlite:///{root / 'mlflow.db'}"
    return params


def run_size(base: dict, workdir: Path, size: int, variants: list[str], seed: int, threads: int) -> dict:
    from contextual_bert.cli import main

    root = workdir / f"n{size}"
    root.mkdir(parents=True, exist_ok=True)
    params_path = root / "params.yaml"
    params_path.write_text(yaml.safe_dump(project_params(base, root, size, variants, seed, threads)))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
    timings = {}

    def stage(*args: str) -> None:
        started = time.perf_counter()
        if main(["--params", str(params_path), *args]) != 0:
            raise SystemExit(f"size {size}: `contextual-bert {' '.join(args)}` failed")
        timings[" ".join(args)] = round(time.perf_counter() - started, 1)

    for name in ("ingest", "validate", "features", "baseline", "optimum"):
        stage(name)
    for variant in variants:
        stage("train", "--variant", variant, "--seed", str(seed))
        stage("evaluate", "--variant", variant, "--seed", str(seed))

    reports = root / Path(base["paths"]["reports_dir"])
    read = lambda name: json.loads((reports / "eval" / f"{name}.json").read_text())  # noqa: E731
    optimum = {"with_context": read("optimum_context")["test"], "without_context": read("optimum_no_context")["test"]}
    popularity = read("popularity")["test"]
    rows = {}
    for variant in variants:
        test = read(f"{variant}-s{seed}")["test"]
        reference = optimum["without_context" if variant in CONTEXT_FREE else "with_context"]
        trained = json.loads((root / Path(base["paths"]["models_dir"]) / f"{variant}-s{seed}" / "metrics.json").read_text())
        rows[variant] = {
            "cross_entropy": test["cross_entropy"], "recall@5": test["recall@5"],
            "gap_to_optimum": test["cross_entropy"] - reference["cross_entropy"],
            "converged": trained.get("converged"), "best_epoch": trained.get("best_epoch"),
            "epochs": trained.get("epochs"), "train_seconds": trained.get("seconds"),
        }
    manifest = json.loads((root / Path(base["paths"]["features_dir"]) / "manifest.json").read_text())
    return {"n_outfits": size, "rows": manifest.get("rows"), "popularity": popularity, "optimum": optimum,
            "variants": rows, "seconds": timings}


def plot(points: list[dict], variants: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    sizes = [p["n_outfits"] for p in points]
    for variant in variants:
        ax.plot(sizes, [p["variants"][variant]["gap_to_optimum"] for p in points], marker="o", label=variant)
    ax.axhline(0.10, color="grey", linestyle="--", linewidth=1, label="0.10 nats")
    ax.set_xscale("log")
    ax.set_xlabel("outfits (log scale)")
    ax.set_ylabel("test cross-entropy minus its optimum (nats)")
    ax.set_title("Gap to the Bayes optimum on planted data")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[15_000, 50_000, 150_000])
    parser.add_argument("--variants", nargs="+", default=["none", "global_state"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/contextual-bert-learning-curve"))
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "learning_curve")
    args = parser.parse_args()

    base = yaml.safe_load(args.params.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    points = []
    for size in sorted(args.sizes):
        points.append(run_size(base, args.workdir, size, args.variants, args.seed, args.threads))
        result = {"variants": args.variants, "seed": args.seed, "points": points,
                  "gap_shrinks": {v: all(a["variants"][v]["gap_to_optimum"] > b["variants"][v]["gap_to_optimum"]
                                          for a, b in zip(points, points[1:])) for v in args.variants}}
        (args.out / "learning_curve.json").write_text(json.dumps(result, indent=2))  # after every size
        plot(points, args.variants, args.out / "learning_curve.png")
        print(json.dumps({"n_outfits": size, **{v: points[-1]["variants"][v] for v in args.variants}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
