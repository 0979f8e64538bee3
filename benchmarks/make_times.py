"""How long a newcomer's two commands take: `make install` then `make test` (or `make repro`) on a fresh clone.

Clones this repository at HEAD, runs `make install` and the target there (each timed, each logged beside the
clone) and adds the run to reports/benchmarks/make_times.json under `runs`, with the commit, the CPU
(`contextual_bert.cpu_kernels.cpu`: Intel Xeon and AMD EPYC differ in time and in bits) and how quiet the machine
was (`other_cpu_s`: CPU time spent outside this benchmark's processes, as in repro_time.py). Its `result` says what
came out: pytest's summary line for `test`; for `repro`, whether reports/table1.md is byte for byte the committed
one and what `dvc status` lists afterwards.

    python benchmarks/make_times.py --target test --beside "nothing"      # what .ci/run runs, less lint
    python benchmarks/make_times.py --target repro --beside "two trainings at nice 19"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from repro_time import children_cpu_s, machine_cpu_s  # noqa: E402

from contextual_bert import cpu_kernels  # noqa: E402

OUT = ROOT / "reports" / "benchmarks" / "make_times.json"
TABLE1 = Path("reports") / "table1.md"


def pytest_summary(log: Path) -> str:
    """pytest's last summary line ("920 passed, 7 skipped in 2495.85s"), without any equals signs."""
    summary = re.compile(r"\b\d+ (passed|failed)\b.* in [\d.]+s")
    lines = [line.strip("= \n") for line in log.read_text().splitlines() if summary.search(line)]
    if not lines:
        raise SystemExit(f"{log}: no pytest summary line")
    return lines[-1]


def repro_result(clone: Path) -> str:
    same = (clone / TABLE1).read_bytes() == (ROOT / TABLE1).read_bytes()
    status = subprocess.run([str(clone / ".venv" / "bin" / "dvc"), "status"], cwd=clone, capture_output=True, text=True)
    stages = [line for line in status.stdout.splitlines() if line.endswith(":") and not line[0].isspace()]
    changed = sorted({line.rstrip(":") for line in stages})
    return (
        f"{TABLE1} {'byte for byte the committed one' if same else 'DIFFERS from the committed one'}; "
        f"dvc status afterwards: {', '.join(changed) or 'nothing'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("test", "repro"), required=True)
    parser.add_argument("--beside", required=True, help="what else ran on the machine meanwhile, in words")
    parser.add_argument("--workdir", type=Path, help="where to clone (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    clone = (args.workdir or Path(tempfile.mkdtemp(prefix="make-times-"))).resolve() / "clone"
    machine_before, children_before = machine_cpu_s(), children_cpu_s()
    started = time.perf_counter()
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    seconds = {}
    for target in ("install", args.target):
        log = clone.parent / f"make-{target}.log"
        began = time.perf_counter()
        with open(log, "w") as out:
            done = subprocess.run(["make", target], cwd=clone, stdout=out, stderr=subprocess.STDOUT)
        seconds[target] = round(time.perf_counter() - began, 1)
        if done.returncode:
            raise SystemExit(f"make {target} failed ({done.returncode}) after {seconds[target]} s: see {log}")
    total = time.perf_counter() - started
    other = (machine_cpu_s() - machine_before) - (children_cpu_s() - children_before)
    log = clone.parent / f"make-{args.target}.log"
    run = {
        "what": f"git clone, make install, make {args.target}",
        "commit": head.stdout.strip(),
        "cpu": cpu_kernels.cpu(),
        "cores": os.cpu_count(),
        "seconds": round(total),
        "minutes": round(total / 60, 1),
        "install_s": seconds["install"],
        f"{args.target}_s": seconds[args.target],
        "other_cpu_s": round(other, 1),
        "quiet": other < 0.02 * total * (os.cpu_count() or 1),
        "beside": args.beside,
        "result": pytest_summary(log) if args.target == "test" else repro_result(clone),
        "by": "benchmarks/make_times.py",
    }
    record = json.loads(args.out.read_text()) if args.out.exists() else {"benchmark": __doc__.split("\n\n")[0]}
    record.setdefault("runs", []).append(run)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(run, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
