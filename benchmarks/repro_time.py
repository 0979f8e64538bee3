"""How long `make repro` takes from a fresh clone, and where the time goes.

Clones this repository at HEAD into a work folder, runs `make install` and then `make repro` there (both
timed), and reads the pipeline flow's task runs from the clone's Prefect database (PREFECT_HOME is the
clone's .prefect/): the stages before and after the trainings, and per training unit its slot time (the
`dvc checkout` of its inputs and `dvc repro` of its train and evaluate stages), the training's own seconds
(reports/train/*.json) and the bring-back in the parent. The difference between a unit's slot time and its
training is what a unit costs besides learning.

    python benchmarks/repro_time.py                     # clone, make repro, write reports/benchmarks/repro.json
    python benchmarks/repro_time.py --analyse DIR --total-s 1700   # a run made already in DIR

Run it on a quiet machine: anything else on the two cores slows the trainings down. How quiet it was is measured:
`other_cpu_s` is the CPU time the machine spent outside this benchmark's processes while it ran (from
/proc/stat, less the children's own), beside the load averages before and after. The file names the commit
and the CPU (`contextual_bert.cpu_kernels.cpu`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from contextual_bert import cpu_kernels  # noqa: E402

OUT = ROOT / "reports" / "benchmarks" / "repro.json"


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def analyse(clone: Path) -> dict:
    """The last `pipeline` flow run in clone/.prefect/prefect.db, broken down by task."""
    db = sqlite3.connect(f"file:{clone / '.prefect' / 'prefect.db'}?mode=ro", uri=True)
    flow_run = db.execute(
        "SELECT fr.id, fr.start_time, fr.end_time FROM flow_run fr JOIN flow f ON fr.flow_id = f.id "
        "WHERE f.name = 'pipeline' AND fr.end_time IS NOT NULL ORDER BY fr.start_time DESC LIMIT 1"
    ).fetchone()
    if flow_run is None:
        raise SystemExit(f"{clone}: no finished pipeline flow run in .prefect/prefect.db")
    run_id, started, ended = flow_run
    tasks = db.execute(
        "SELECT name, start_time, end_time FROM task_run WHERE flow_run_id = ? AND end_time IS NOT NULL "
        "ORDER BY start_time",
        (run_id,),
    ).fetchall()
    units = {n.split()[1]: _seconds(s, e) for n, s, e in tasks if n.startswith("train ") and n.endswith("process")}
    bring = {n.split()[2]: _seconds(s, e) for n, s, e in tasks if n.startswith("bring back ")}
    series = {
        n.removeprefix("dvc repro "): round(_seconds(s, e), 1)
        for n, s, e in tasks
        if n.startswith("dvc repro ") and "@" not in n
    }
    trained = {}
    for path in sorted((clone / "reports" / "train").glob("*.json")):
        record = json.loads(path.read_text())
        trained[f"{record['model']}-{record['seed']}"] = record["seconds"]
    slot = sum(units.values())
    learning = sum(trained.get(key, 0.0) for key in units)
    unit_starts = [s for n, s, _ in tasks if n.startswith("train ") and n.endswith("process")]
    unit_ends = [e for n, _, e in tasks if n.startswith("bring back ")]
    return {
        "flow_s": round(_seconds(started, ended), 1),
        "series_stages_s": series,
        "fan_out_s": round(_seconds(min(unit_starts), max(unit_ends)), 1) if units else 0.0,
        "units": len(units),
        "unit_slot_s": round(slot, 1),
        "training_s": round(learning, 1),
        "per_unit_besides_training_s": round((slot - learning) / max(1, len(units)), 2),
        "training_s_per_unit": {key: round(trained[key], 1) for key in sorted(trained)},
        "bring_back_mean_s": round(sum(bring.values()) / max(1, len(bring)), 2),
    }


def machine_cpu_s() -> float:
    """Every core's busy time since boot (user, nice, system, irq, softirq, steal), in seconds."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="where to clone (default: a temporary folder)")
    parser.add_argument("--analyse", type=Path, metavar="DIR", help="only read a run made already in DIR")
    parser.add_argument("--total-s", type=float, help="with --analyse: the run's measured wall time")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    result: dict = {
        "benchmark": "repro_time",
        "commit": head,
        "cpu": cpu_kernels.cpu(),
        "cores": os.cpu_count(),
        "load_average_before": os.getloadavg(),
    }
    machine_before, children_before = machine_cpu_s(), children_cpu_s()
    if args.analyse:
        clone = args.analyse.resolve()
        result.update(total_s=args.total_s, install_s=None, how="analysed a run made by hand: git clone, make repro")
    else:
        clone = (args.workdir or Path(tempfile.mkdtemp(prefix="repro-time-"))).resolve() / "clone"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        timings = {}
        for target in ("install", "repro"):
            started = time.perf_counter()
            with open(clone.parent / f"make-{target}.log", "w") as log:
                subprocess.run(["make", target], cwd=clone, stdout=log, stderr=subprocess.STDOUT, check=True)
            timings[target] = time.perf_counter() - started
        result.update(
            total_s=round(sum(timings.values()), 1),
            install_s=round(timings["install"], 1),
            how="git clone, make install, make repro",
        )
    if not args.analyse:
        other = (machine_cpu_s() - machine_before) - (children_cpu_s() - children_before)
        result.update(
            other_cpu_s=round(other, 1),
            load_average_after=os.getloadavg(),
            quiet=other < 0.02 * result["total_s"] * (os.cpu_count() or 1),
        )
    result.update(analyse(clone))
    if result.get("total_s"):
        result["total_min"] = round(result["total_s"] / 60, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
