"""The measurement behind an entry of `cpu_kernels.FASTEST`: native against pinned (avx2) kernels on this CPU.

Runs `train_throughput.py --softmax sampled --no-reference` in fresh processes, round-robin: each round times
every thread count under both settings (their order alternating from round to round), so that the machine's drift
and load reach both alike. Writes reports/benchmarks/cpu_kernels_<vendor>.json: each run's rates (wall clock, and
per CPU second of the process: at one thread the measure other work on the machine disturbs least) and load
averages, per thread count and variant the median rate of each setting and native / pinned, the commit and the
CPU (vendor, family, model).

    .venv/bin/python benchmarks/cpu_kernels_choice.py [--rounds 3] [--threads 1 2] [--steps 8] [--note "..."]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from contextual_bert import cpu_kernels  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--variants", nargs="+", default=["global_state_update", "none"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--note", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cpu = cpu_kernels.cpu()
    out = args.out or ROOT / "reports" / "benchmarks" / f"cpu_kernels_{cpu['vendor'].lower() or 'unknown'}.json"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            settings = ("native", "avx2") if round_ % 2 == 0 else ("avx2", "native")
            for threads in args.threads:
                for setting in settings:
                    path = Path(tmp) / f"{round_}-{threads}-{setting}.json"
                    cmd = [sys.executable, str(ROOT / "benchmarks" / "train_throughput.py"), "--softmax", "sampled"]
                    cmd += ["--no-reference", "--cpu-kernels", setting, "--threads", str(threads)]
                    cmd += ["--steps", str(args.steps), "--variants", *args.variants, "--out", str(path)]
                    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
                    report = json.loads(path.read_text())
                    rows = report["variants_sampled"]
                    machine = report["machine"]
                    runs.append({
                        "round": round_, "threads": threads, "setting": setting,
                        "train_samples_per_s": {v: row["train_samples_per_s"] for v, row in rows.items()},
                        "train_cpu_samples_per_s": {v: row["train_cpu_samples_per_s"] for v, row in rows.items()},
                        "in_effect": machine["cpu_kernels"],
                        "load_average_before": machine["load_average_before"],
                        "load_average_after": machine["load_average_after"],
                    })  # fmt: skip
                    print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for threads in args.threads:
        for variant in args.variants:
            row = {}
            for measure in ("train_samples_per_s", "train_cpu_samples_per_s"):
                median = {
                    s: statistics.median(r[measure][variant] for r in runs if (r["threads"], r["setting"]) == (threads, s))
                    for s in ("native", "avx2")
                }  # fmt: skip
                prefix = "" if measure == "train_samples_per_s" else "cpu_"
                row |= {
                    f"{prefix}native_median": round(median["native"], 1),
                    f"{prefix}avx2_median": round(median["avx2"], 1),
                    f"{prefix}native_over_avx2": round(median["native"] / median["avx2"], 3),
                }
            summary[f"{threads} threads, {variant}"] = row
    loads = [x for r in runs for x in (r["load_average_before"][0], r["load_average_after"][0])]
    report = {
        "benchmark": "cpu_kernels_choice",
        "what": "train_throughput.py --softmax sampled --no-reference, native against pinned (avx2) kernels, "
        "fresh processes, round-robin",
        "commit": commit,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "steps": args.steps,
        "rounds": args.rounds,
        "load_average_1min_range": [min(loads), max(loads)],
        "note": args.note,
        "summary": summary,
        "runs": runs,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
