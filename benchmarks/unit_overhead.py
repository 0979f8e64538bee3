"""What a training unit of `make repro` costs besides its training: the two stage processes the unit's `dvc repro`
runs, each timed from outside (`contextual-bert train`: its wall time less the training's own `seconds`, i.e. the
imports, the data, the MLflow run around it; `contextual-bert evaluate`: all of it), and one `dvc` command in this
workspace (`dvc status` of the unit's two stages: DVC's start, its lock and the hashing of their dependencies).
The unit's checkout and the parent's bring-back are in `repro.json` (`benchmarks/repro_time.py`) and the flow's
log; this file says how the rest of the 48 s splits.

The stages run on params.yaml's features (`make repro` first), with models, reports and the MLflow store (SQLite)
in a temporary folder; nothing of the workspace is written. Writes reports/benchmarks/unit_overhead.json with the
commit, the CPU and the load average before and after.

    .venv/bin/python benchmarks/unit_overhead.py [--model bag_of_items] [--seed 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from contextual_bert import cpu_kernels  # noqa: E402

OUT = ROOT / "reports" / "benchmarks" / "unit_overhead.json"
BIN = Path(sys.executable).parent


def timed(command: list[str], env: dict, cwd: Path) -> float:
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(command)}` failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bag_of_items", help="any model name (train.models)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    features = ROOT / params["paths"]["features_dir"]
    if not (features / "manifest.json").exists():
        raise SystemExit(f"{features}: no features (run `make repro` first)")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="unit-overhead-") as tmp:
        work = Path(tmp)
        own = json.loads(json.dumps(params))
        own["paths"] = {k: str(work / v) for k, v in params["paths"].items()} | {"features_dir": str(features)}
        (work / "params.yaml").write_text(yaml.safe_dump(own, sort_keys=False))
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}", "TQDM_DISABLE": "1"}
        unit = ["--model", args.model, "--seed", str(args.seed)]
        cli = [str(BIN / "contextual-bert"), "--params", str(work / "params.yaml")]
        train_s = timed([*cli, "train", *unit], env, work)
        metrics = json.loads(
            (work / params["paths"]["reports_dir"] / "train" / f"{args.model}-s{args.seed}.json").read_text()
        )
        evaluate_s = timed([*cli, "evaluate", *unit], env, work)
    stages = [f"train@{args.model}-{args.seed}", f"evaluate@{args.model}-{args.seed}"]
    dvc_s = timed([str(BIN / "dvc"), "status", *stages], dict(os.environ), ROOT)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    report = {
        "benchmark": "unit_overhead",
        "commit": commit,
        "cpu": cpu_kernels.cpu(),
        "model": args.model,
        "seed": args.seed,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "train_process_s": round(train_s, 2),
        "training_s": round(metrics["seconds"], 2),
        "train_process_besides_training_s": round(train_s - metrics["seconds"], 2),
        "evaluate_process_s": round(evaluate_s, 2),
        "dvc_status_s": round(dvc_s, 2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
