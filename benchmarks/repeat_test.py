"""Run one pytest node N times in a row and record every outcome: how a test once flaky is shown stable.

    python benchmarks/repeat_test.py "tests/flows/test_stack.py::test_faults_a_worker_killed_mid_training_and_postgres_down_for_10_s" \
        --times 10 --out reports/benchmarks/fault_test_repeated.json

Each run is a fresh pytest process (module fixtures, the stack included, built again). The record is rewritten
after every run, so a partial series is kept: per run its start (UTC), seconds, exit code, pass / fail, the
test's own printed summary lines and, on failure, the tail of its output. It stops at the first failure only
with --stop.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("node", help="a pytest node id")
    parser.add_argument("--times", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per run before it counts as failed")
    parser.add_argument("--stop", action="store_true", help="stop at the first failure")
    args = parser.parse_args()
    if args.times < 1:
        parser.error("--times must be at least 1")

    record = {
        "node": args.node,
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True, capture_output=True).stdout.strip(),
        "host": {"cpus": os.cpu_count(), "load_at_start": os.getloadavg()},
        "runs": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for i in range(1, args.times + 1):
        started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-s", "-p", "no:cacheprovider", args.node],
                cwd=ROOT,
                text=True,
                capture_output=True,
                timeout=args.timeout,
            )
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, output = None, f"timed out after {args.timeout} s\n{exc.stdout or ''}"
        run = {
            "run": i,
            "started_utc": started,
            "seconds": round(time.monotonic() - t0, 1),
            "exit_code": code,
            "passed": code == 0,
            "load_after": [round(x, 1) for x in os.getloadavg()],
            "summary": [
                line
                for line in output.splitlines()
                if line.startswith(("fault run:", "undisturbed nightly")) or " passed" in line or " failed" in line
            ],
        }
        if code != 0:
            run["tail"] = output[-4000:]
        record["runs"].append(run)
        record["passed"] = sum(r["passed"] for r in record["runs"])
        record["ran"] = len(record["runs"])
        args.out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"run {i}: {'passed' if code == 0 else 'FAILED'} in {run['seconds']} s", flush=True)
        if code != 0 and args.stop:
            break
    return 0 if record["passed"] == record["ran"] else 1


if __name__ == "__main__":
    sys.exit(main())
