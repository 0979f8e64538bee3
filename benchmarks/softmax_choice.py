"""Full against sampled softmax (train.softmax, train.negatives) at the same epochs: validation cross-entropy
(always the full softmax's) and training time, on a features directory of its own (issue 44).

Each run is `training.train` with the params file's settings for the variant, only softmax / negatives
(and, if given, max_epochs) changed, on one torch thread; no MLflow. Results are appended to --out after
every run, so a run cut short keeps what finished.

    .venv/bin/python benchmarks/softmax_choice.py --params P/params.yaml --features P/data/features \\
        --models-dir P/models --out reports/benchmarks/softmax_choice_default.json \\
        --runs global_state_update:full:0:0 global_state_update:sampled:256:0 [--max-epochs 12] [--note ...]

A run is variant:softmax:negatives:seed (negatives is ignored by full).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from contextual_bert.config import load_config
from contextual_bert.training import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, required=True)
    parser.add_argument("--features", type=Path, required=True)
    parser.add_argument("--models-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", nargs="+", required=True)
    parser.add_argument("--max-epochs", type=int)
    parser.add_argument("--note", default="")
    args = parser.parse_args()

    cfg = load_config(args.params)
    torch.set_num_threads(1)
    report = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
    report.update(
        what="full vs sampled softmax at the same epochs: best validation cross-entropy (full ranking) "
        "and seconds, one torch thread",
        params=str(args.params),
        features=str(args.features),
        manifest=json.loads((args.features / "manifest.json").read_text()).get("counts"),
        note=args.note,
    )
    for spec in args.runs:
        variant, softmax, negatives, seed = spec.split(":")
        update = {"softmax": softmax, "negatives": int(negatives), "num_threads": 1, "device": "cpu"}
        if args.max_epochs:
            update["max_epochs"] = args.max_epochs
        train_cfg = cfg.train_for(variant).model_copy(update=update)
        out_dir = args.models_dir / f"{variant}-{softmax}{negatives if softmax == 'sampled' else ''}-s{seed}"
        load_before = os.getloadavg()
        started = time.perf_counter()
        metrics = train(args.features, out_dir, variant, int(seed), cfg.model_for(variant), train_cfg)
        history = json.loads((out_dir / "curve.json").read_text())
        row = {"variant": variant, "softmax": softmax, "negatives": int(negatives) if softmax == "sampled" else None,
               "seed": int(seed), "max_epochs": train_cfg.max_epochs, "batch_size": train_cfg.batch_size,
               "learning_rate": train_cfg.learning_rate,
               "best_val_cross_entropy": round(metrics["best_val_cross_entropy"], 4),
               "best_epoch": metrics["best_epoch"], "epochs": metrics["epochs"], "converged": metrics["converged"],
               "train_seconds": round(sum(r["seconds"] for r in history), 1),
               "mean_train_samples_per_s": round(sum(r["samples_per_s"] for r in history) / len(history), 1),
               "wall_seconds": round(time.perf_counter() - started, 1),
               "val_cross_entropy": [round(r["val_cross_entropy"], 4) for r in history],
               "load_average_before": [round(x, 2) for x in load_before],
               "load_average_after": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
        report["runs"] = [r for r in report["runs"]
                          if (r["variant"], r["softmax"], r["negatives"], r["seed"]) !=
                          (row["variant"], row["softmax"], row["negatives"], row["seed"])] + [row]  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k != "val_cross_entropy"}), flush=True)


if __name__ == "__main__":
    main()
