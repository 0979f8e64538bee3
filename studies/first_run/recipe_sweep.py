"""The first run's recipe: each model trained at a shorter cosine horizon, over the learning rates of
settings.yaml, on the default data (seed 0, validation only). One `contextual-bert train` process per cell, two
at a time, each in a folder of its own under --work (its params.yaml: the repository's with the cell's
`per_model.<model>` settings, paths under the cell, the features the repository's); results.json gets every
cell's best validation cross-entropy, best epoch, epochs, convergence and seconds.

    python studies/first_run/recipe_sweep.py --work /tmp/first_run [--jobs 2] [--groups encoders_20] [--extra none=0.008 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = HERE / "results.json"


def cells(settings: dict, params: dict, extra: list[str], groups: list[str] | None = None) -> list[dict]:
    out = []
    for name, group in settings["cells"].items():
        if groups and name not in groups:
            continue
        for variant in group["models"]:
            for epochs in group["max_epochs"]:
                for batch in group.get("batch_size", [None]):  # None: params.yaml's
                    for lr in group["learning_rate"]:
                        rate = params["per_model"][variant]["learning_rate"] if lr == "params" else lr
                        cell = {"variant": variant, "max_epochs": epochs, "learning_rate": rate}
                        out.append(cell if batch is None else {**cell, "batch_size": batch})
    for item in extra:  # model=rate: the declared extension past the grid's top
        variant, rate = item.split("=")
        epochs = max(c["max_epochs"] for c in out if c["variant"] == variant)
        out.append({"variant": variant, "max_epochs": epochs, "learning_rate": float(rate)})
    return out


def cell_name(cell: dict) -> str:
    batch = f"-b{cell['batch_size']}" if "batch_size" in cell else ""
    return f"{cell['variant']}-e{cell['max_epochs']}{batch}-lr{cell['learning_rate']}"


def run_cell(cell: dict, params: dict, seed: int, work: Path) -> dict:
    folder = work / cell_name(cell)
    folder.mkdir(parents=True, exist_ok=True)
    own = json.loads(json.dumps(params))
    own["paths"] = {k: str(folder / v) for k, v in params["paths"].items()}
    own["paths"]["features_dir"] = str(ROOT / params["paths"]["features_dir"])
    own["per_model"][cell["variant"]] = {
        **params["per_model"][cell["variant"]],
        **{k: cell[k] for k in ("learning_rate", "max_epochs", "batch_size") if k in cell},
    }
    (folder / "params.yaml").write_text(yaml.safe_dump(own, sort_keys=False))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    started = time.perf_counter()
    with open(folder / "train.log", "w") as log:
        subprocess.run(
            [
                "contextual-bert",
                "--params",
                str(folder / "params.yaml"),
                "train",
                "--model",
                cell["variant"],
                "--seed",
                str(seed),
            ],
            cwd=folder,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )
    result = json.loads((folder / "reports" / "train" / f"{cell['variant']}-s{seed}.json").read_text())
    return {
        **cell,
        "seed": seed,
        "process_s": round(time.perf_counter() - started, 1),
        **{k: result[k] for k in ("best_val_cross_entropy", "best_epoch", "epochs", "converged", "seconds")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--extra", nargs="*", default=[], help="model=rate: the declared extension")
    parser.add_argument("--groups", nargs="*", help="settings.yaml's cell groups to run (default: all)")
    args = parser.parse_args()
    settings = yaml.safe_load((HERE / "settings.yaml").read_text())
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    todo = cells(settings, params, args.extra, args.groups)
    done = json.loads(RESULTS.read_text())["cells"] if RESULTS.exists() else []
    todo = [c for c in todo if cell_name(c) not in {cell_name(d) for d in done}]
    with ThreadPoolExecutor(args.jobs) as pool:
        for row in pool.map(lambda c: run_cell(c, params, settings["seed"], args.work), todo):
            done.append(row)
            print(json.dumps(row), flush=True)
            RESULTS.write_text(json.dumps({"settings": settings, "cells": done}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
