"""Table 1 on other data or settings than params.yaml's, without touching the repository's data or reports.

A project of its own under --workdir (studies/project.py) runs the pipeline's stages with params.yaml's
settings and the --set overrides: ingest -> validate -> features -> baseline -> optimum -> train + evaluate
(every train.models model x train.seeds seed, --jobs at a time) -> report. Its Table 1 (one string a line), the
report's metrics and the command's settings go to the study's results.json as <run>/table1, <run>/metrics and
<run>/settings.

    python studies/table1_on/table1_on.py --set ingest.source=hm --run hm_sample --workdir /tmp/table1-hm

(`import_hm.source` in params.yaml names the H&M files: ../shared/data/hm_sample by default.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import Project, override, record, relocated  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a params override")
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--jobs", type=int, default=2, help="trainings at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per training")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--run", required=True, help="the run's key in the results file")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"), help="the results file")
    args = parser.parse_args()

    base = yaml.safe_load(args.params.read_text())
    for assignment in args.set:
        override(base, assignment)
    base["train"]["num_threads"] = args.threads
    project = Project(args.workdir, relocated(base, args.workdir), args.threads)
    for stage in ("ingest", "validate", "features", "baseline", "optimum"):
        project.stage(stage)
    train = project.params["train"]
    project.train_and_evaluate([(v, s) for v in train["models"] for s in train["seeds"]], args.jobs)
    project.stage("report")

    reports = project.path("reports_dir")
    table1 = (reports / "table1.md").read_text()
    record(args.out, f"{args.run}/table1", table1.splitlines())
    record(args.out, f"{args.run}/metrics", json.loads((reports / "metrics.json").read_text()))
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    commit = git.stdout.strip()
    settings = {"commit": commit or None, "set": args.set, "seconds": project.timings}
    record(args.out, f"{args.run}/settings", settings)
    print(table1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
