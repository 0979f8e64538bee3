"""Where a default training's time goes: one `contextual-bert train` run, its parts timed in place.

The run is the CLI's (`track_training` around `training.train`, on the features in params.yaml's
`paths.features_dir`), with its MLflow run in a temporary SQLite store and its outputs in a temporary folder.
The loop's parts are wrapped with timers where the Trainer's modules (`training/`) call them, so the numbers are the
real run's: masking, the forward pass with its loss, the rest of the step (backward, clipping, AdamW, the
schedule), the per-epoch validation and training probe (the same ranking pass, told apart by their data),
the warm-up's stuck check, the best checkpoint, `last.pt`, the curve's JSON, the MLflow epoch logging; and
around them the start (imports, data, model) and whatever is left. `--epochs` shortens the run (the cosine
horizon with it): the shares per epoch are what it measures. Writes reports/benchmarks/profile_run.json with
the commit, the CPU and the load average before and after (other work on the machine slows every part).

    .venv/bin/python benchmarks/profile_run.py [--model global_state] [--epochs 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTED = time.perf_counter()

from contextual_bert import cpu_kernels  # noqa: E402
from contextual_bert.config import load_config  # noqa: E402

PARTS = {  # (module of training/, name the Trainer's code calls there) -> the part it is
    ("loop", "mask_items"): "masking",
    ("loop", "masked_item_loss"): "forward and loss",
    ("trainer", "train_step"): "step",  # minus the two above: backward, clipping, AdamW, schedule
    ("warmup_hook", "stuck_check"): "stuck check",
    ("checkpoints", "save_checkpoint"): "best checkpoint",
    ("unseen_fit", "save_checkpoint"): "best checkpoint",
    ("checkpoints", "save_resume_state"): "last.pt",
    ("checkpoints", "write_json"): "curve and metrics JSON",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="global_state", help="any model name (train.models)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=4, help="train.max_epochs for this run (0: params.yaml's)")
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks" / "profile_run.json")
    args = parser.parse_args()

    cfg = load_config(args.params)
    train_cfg = cfg.train_for(args.model)
    if args.epochs:
        train_cfg = train_cfg.model_copy(update={"max_epochs": args.epochs})
    cpu_kernels.pin(train_cfg.cpu_kernels)
    work = Path(tempfile.mkdtemp(prefix="profile_run_"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"

    import torch  # noqa: F401  (after pin)

    from contextual_bert.registry import track_training
    from contextual_bert.training import checkpoints, loop, trainer, unseen_fit, warmup_hook

    modules = {
        "loop": loop,
        "trainer": trainer,
        "warmup_hook": warmup_hook,
        "checkpoints": checkpoints,
        "unseen_fit": unseen_fit,
    }

    seconds: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.Counter()

    def timed(module, name: str, part: str, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                seconds[part] += time.perf_counter() - t
                calls[part] += 1

        setattr(module, name, wrapper)

    for (module_name, name), part in PARTS.items():
        module = modules[module_name]
        timed(module, name, part, getattr(module, name))
    validation, validated_row = trainer.validation_cross_entropy, trainer.Trainer.validated_row
    passes = iter(())  # within validated_row: the validation, then the training probe

    def ranking_pass(model, data, batch_size, device):
        part, t = next(passes, "warm-up start"), time.perf_counter()
        try:
            return validation(model, data, batch_size, device)
        finally:
            seconds[part] += time.perf_counter() - t
            calls[part] += 1

    def validating(*a, **kw):
        nonlocal passes
        passes = iter(("validation", "training probe"))
        return validated_row(*a, **kw)

    trainer.Trainer.validated_row = validating
    trainer.validation_cross_entropy = ranking_pass

    features = cfg.paths.features_dir if cfg.paths.features_dir.is_absolute() else ROOT / cfg.paths.features_dir
    started_run = time.perf_counter()
    load_before = os.getloadavg()
    with track_training(cfg, args.model, args.seed, work / "run", params_file=args.params) as tracker:

        def log_epoch(epoch: int, row: dict) -> None:
            t = time.perf_counter()
            tracker.log_epoch(epoch, row)
            seconds["MLflow epoch logging"] += time.perf_counter() - t
            calls["MLflow epoch logging"] += 1

        t = time.perf_counter()
        result = trainer.train(
            features, work / "run", args.model, args.seed, cfg.model_for(args.model), train_cfg, on_epoch_end=log_epoch
        )
        seconds["train() total"] = time.perf_counter() - t
        t = time.perf_counter()
        tracker.log_result(result)
        seconds["MLflow result logging"] = time.perf_counter() - t
    total = time.perf_counter() - started_run
    seconds["step"] -= seconds["masking"] + seconds["forward and loss"]
    inside = sum(v for k, v in seconds.items() if k not in ("train() total", "MLflow result logging"))
    seconds["rest of train() (data, model, epoch bookkeeping)"] = seconds["train() total"] - inside
    epochs = result["epochs"]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain", "src", "params.yaml"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    )
    report = {
        "benchmark": "profile_run",
        "commit": commit,
        "uncommitted_changes": dirty,
        "cpu": cpu_kernels.cpu(),
        "model": args.model,
        "seed": args.seed,
        "epochs": epochs,
        "batch_size": train_cfg.batch_size,
        "threads": train_cfg.num_threads,
        "steps_per_epoch": result.get("steps_per_epoch"),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "process_start_to_run_s": round(started_run - STARTED, 2),
        "run_s": round(total, 2),
        "parts_s": {k: round(v, 3) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])},
        "parts_per_epoch_s": {k: round(v / epochs, 3) for k, v in seconds.items() if k != "train() total"},
        "share_of_run": {k: round(v / total, 4) for k, v in seconds.items() if k != "train() total"},
        "calls": dict(calls),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
