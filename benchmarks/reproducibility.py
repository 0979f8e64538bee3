"""Same inputs, same numbers? One training of the default data, run in fresh processes under settings that
differ between two x86 CPUs of one kind, compared bit for bit, and what each setting costs.

There is one machine here, so what differs between machines is emulated on it: the ATen kernels' instruction
set (ATEN_CPU_CAPABILITY: avx512 where the CPU has it, else avx2), MKL's code path (MKL_ENABLE_INSTRUCTIONS,
and its conditional numerical reproducibility MKL_CBWR), oneDNN's (ONEDNN_MAX_CPU_ISA) and the thread count.
Each configuration trains `--model` seed 0 for `--epochs` epochs (the real `training.train`, the default
data built by benchmarks/serving_latency.build_project at params' generate.size) in a process of its own;
the result is the SHA-256 of the final weights, the validation cross-entropy per epoch and the wall and CPU
seconds. Configurations run round-robin `--repeats` times, so the machine's load (a shared 2-core CPU) spreads
over all of them alike; the cost of a setting is its median CPU seconds against the baseline's.

    .venv/bin/python benchmarks/reproducibility.py [--epochs 3] [--repeats 2] [--model global_state]
Writes reports/benchmarks/reproducibility.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving_latency import REPO, build_project  # noqa: E402

OUT = REPO / "reports" / "benchmarks" / "reproducibility.json"
# name -> environment (+ "threads": train.num_threads, + "DETERMINISTIC": "0" for torch's deterministic
# algorithms off). "baseline" is what a training does by default on this CPU.
CONFIGS = {
    "baseline": {},
    "deterministic_algorithms_off": {"DETERMINISTIC": "0"},
    "two_threads": {"threads": "2"},
    "aten_avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "mkl_avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "onednn_avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "an_avx2_machine": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "pinned": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "pinned_on_an_avx2_machine": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_CBWR": "AVX2,STRICT",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
}
ENV_KEYS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DETERMINISTIC")


def one_run(features_dir: Path, model: str, epochs: int, threads: int) -> dict:
    """Train in this process (its environment set by the caller); the result as a dict."""
    import torch

    import contextual_bert.training as training
    from contextual_bert.config import load_config

    if os.environ.get("DETERMINISTIC") == "0":
        # the Trainer switches torch's deterministic algorithms on through this torch call (resume.py's
        # pin_threads_and_algorithms); made a no-op here, so the run keeps torch's default (off)
        torch._C._set_deterministic_algorithms = lambda *args, **kwargs: None
    cfg = load_config(REPO / "params.yaml")
    train_cfg = cfg.train_for(model).model_copy(
        update={"max_epochs": epochs, "num_threads": threads, "device": "cpu", "checkpoint_every_s": 0}
    )
    with tempfile.TemporaryDirectory(prefix="repro-run-") as out:
        wall, cpu = time.perf_counter(), time.process_time()
        training.train(features_dir, Path(out), model, 0, cfg.model_for(model), train_cfg)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        weights = torch.load(Path(out) / "last.pt", weights_only=True)["model"]
        history = json.loads((Path(out) / "curve.json").read_text())
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(weights[name].numpy().tobytes())
    return {
        "sha256": digest.hexdigest(),
        "val_cross_entropy": [row["val_cross_entropy"] for row in history],
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="global_state", help="any model name (train.models)")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--from-log", type=Path, help="summarise the runs printed by an earlier invocation")
    parser.add_argument("--note", default="")
    parser.add_argument("--run", nargs=3, metavar=("FEATURES_DIR", "EPOCHS", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(one_run(Path(args.run[0]), args.model, int(args.run[1]), int(args.run[2]))))
        return

    from contextual_bert.config import load_config

    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {name: [] for name in args.configs}
    if args.from_log:  # lines "<config> <repeat> <json>"; a config killed before its line is left out
        for line in args.from_log.read_text().splitlines():
            name, _, rest = line.partition(" ")
            if name in runs and rest[:1].isdigit() and " {" in rest:
                runs[name].append(json.loads(rest.split(" ", 1)[1]))
        runs = {name: results for name, results in runs.items() if results}
    else:
        with tempfile.TemporaryDirectory(prefix="repro-data-") as tmp:
            # the data and features only: the untrained encoder build_project also writes is not used
            _, features_dir = build_project(Path(tmp), load_config(REPO / "params.yaml").generate.size, "none")
            for repeat in range(args.repeats):
                for name in args.configs:
                    settings = dict(CONFIGS[name])
                    threads = settings.pop("threads", "1")
                    env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
                    env.update(settings, TQDM_DISABLE="1")
                    proc = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--model",
                            args.model,
                            "--run",
                            str(features_dir),
                            str(args.epochs),
                            threads,
                        ],
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=3600,
                    )
                    if proc.returncode != 0:
                        raise SystemExit(f"{name}: {proc.stderr[-2000:]}")
                    runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                    print(name, repeat, json.dumps(runs[name][-1]), flush=True)

    base = runs["baseline"][0] if "baseline" in runs else None
    base_cpu = statistics.median(r["cpu_s"] for r in runs["baseline"]) if "baseline" in runs else None
    summary = {}
    for name, results in runs.items():
        shas = {r["sha256"] for r in results}
        entry = {
            "settings": CONFIGS[name],
            "bit_identical_across_its_repeats": len(shas) == 1,
            "val_cross_entropy": results[0]["val_cross_entropy"],
            "cpu_s_median": statistics.median(r["cpu_s"] for r in results),
            "wall_s_median": statistics.median(r["wall_s"] for r in results),
            "cpu_capability": results[0]["cpu_capability"],
            "threads": results[0]["threads"],
        }
        if base is not None:
            entry["bit_identical_to_baseline"] = shas == {base["sha256"]}
            entry["max_abs_val_ce_difference_to_baseline"] = max(
                abs(a - b) for a, b in zip(results[0]["val_cross_entropy"], base["val_cross_entropy"])
            )
            entry["cpu_cost_vs_baseline"] = round(entry["cpu_s_median"] / base_cpu - 1, 3)
        summary[name] = entry
    groups: dict[str, list[str]] = {}
    for name, results in runs.items():
        groups.setdefault(results[0]["sha256"][:16], []).append(name)
    result = {
        "what": f"{args.model} seed 0, {args.epochs} epochs of the default data, one process per run, "
        f"{args.repeats} round-robin repeats",
        "note": args.note,
        "configs": summary,
        "same_bits": list(groups.values()),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "cpu": _cpu_name(),
            "load_average_before": None if args.from_log else [round(x, 2) for x in load_before],
            "load_average_after": None if args.from_log else [round(x, 2) for x in os.getloadavg()],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def _cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


if __name__ == "__main__":
    main()
