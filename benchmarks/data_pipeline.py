"""Time the raw-data stages: generate and validate at the paper's size, import (and validate) the H&M sample.

validate_paper_with_faults validates the same data with faults planted, so quarantine is exercised at scale.
import_sets imports the paper-size outfits written as curated (outfit, item, customer) pairs to a CSV.

Each step runs in a process of its own, so its peak resident memory is its own. Writes
reports/benchmarks/data_pipeline.json with wall and CPU seconds, peak RSS and row counts per step, the
targets (generate and validate at the paper size each under 2 minutes on this 2-core machine), and the
load average around the run (other work on the machine slows the numbers).

    .venv/bin/python benchmarks/data_pipeline.py [--size paper] [--hm-source ../shared/data/hm_sample]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 120.0


def run_step(step: str, work: Path, size: str, hm_source: Path) -> dict:
    """One step, in this process (called in a child): its result, wall/CPU seconds and peak RSS."""
    from contextual_bert.config import GenerateConfig, ImportHMConfig, ValidateConfig

    started, cpu_started = time.perf_counter(), time.process_time()
    if step == "generate":
        from contextual_bert.data import generate

        result = generate(GenerateConfig().sizes[size], seed=0, out_dir=work / "paper" / "raw")
        rows = result["rows"]
    elif step == "import_sets":
        from contextual_bert.config import ImportSetsConfig
        from contextual_bert.data import import_sets

        result = import_sets(work / "pairs.csv", work / "sets" / "raw", ImportSetsConfig(customer_column="customer"))
        rows = result["rows"] | {"pairs": result["pairs"], "sets_kept": result["sets_kept"]}
    elif step == "import_hm":
        from contextual_bert.data import import_hm

        result = import_hm(hm_source, work / "hm" / "raw", ImportHMConfig())
        rows = result["rows"] | {"baskets": result["baskets"], "baskets_kept": result["baskets_kept"]}
    else:  # validate_paper / validate_paper_with_faults / validate_hm
        from contextual_bert.data import validate

        root = work / {"validate_paper": "paper", "validate_paper_with_faults": "faulty", "validate_hm": "hm"}[step]
        if step == "validate_paper_with_faults":
            _corrupt_copy(work / "paper" / "raw", root / "raw")
        summary = validate(root / "raw", root / "validated", root / "quarantine", root / "reports",
                           ValidateConfig(max_quarantine_share=1.0))  # fmt: skip
        rows = {name: {k: t[k] for k in ("rows_in", "valid", "quarantined")} for name, t in summary["tables"].items()}
    return {
        "wall_s": round(time.perf_counter() - started, 2),
        "cpu_s": round(time.process_time() - cpu_started, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rows": rows,
    }


def _corrupt_copy(raw: Path, out: Path) -> None:
    """The paper-size data with faults: 1% of articles priced -1, 2% of outfits for an unknown occasion
    (and, through the bad articles, more outfits quarantined as referencing them)."""
    import shutil

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(raw, out)
    articles = pq.read_table(out / "articles.parquet")
    price = articles.column("price").to_numpy().copy()
    price[::100] = -1.0
    pq.write_table(articles.set_column(articles.column_names.index("price"), "price", pa.array(price)),
                   out / "articles.parquet")  # fmt: skip
    outfits = pq.read_table(out / "outfits.parquet")
    occasion = np.array(outfits.column("occasion").to_pylist(), dtype=object)
    occasion[::50] = "brunch"
    column = outfits.column_names.index("occasion")
    pq.write_table(outfits.set_column(column, "occasion", pa.array(occasion.tolist(), pa.string())),
                   out / "outfits.parquet")  # fmt: skip


def _pairs_csv(raw: Path, out: Path) -> None:
    """The generated outfits as curated pairs: one line per (outfit, item, customer), as a pairs export has."""
    import pandas as pd

    outfits = pd.read_parquet(raw / "outfits.parquet", columns=["outfit_id", "customer_id", "article_ids"])
    pairs = outfits.explode("article_ids")
    pairs.rename(columns={"article_ids": "item_id", "customer_id": "customer"})[
        ["outfit_id", "item_id", "customer"]].to_csv(out, index=False)  # fmt: skip


def _child(step: str, work: Path, size: str, hm_source: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--step", step, "--work", str(work), "--size", size, "--hm-source", str(hm_source)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="paper")
    parser.add_argument("--hm-source", type=Path, default=REPO.parent / "shared" / "data" / "hm_sample")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "benchmarks" / "data_pipeline.json")
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:  # a child: one step, its numbers as the last line of stdout
        print(json.dumps(run_step(args.step, args.work, args.size, args.hm_source)))
        return

    from contextual_bert.config import GenerateConfig

    load_before = os.getloadavg()
    steps = {}
    with tempfile.TemporaryDirectory() as tmp:
        for step in (
            "generate",
            "validate_paper",
            "validate_paper_with_faults",
            "import_sets",
            "import_hm",
            "validate_hm",
        ):
            if step.endswith("hm") and not args.hm_source.is_dir():
                steps[step] = {"skipped": f"{args.hm_source} is absent"}
                continue
            if step == "import_sets":  # its input written here, untimed
                _pairs_csv(Path(tmp) / "paper" / "raw", Path(tmp) / "pairs.csv")
            steps[step] = _child(step, Path(tmp), args.size, args.hm_source)
            print(step, steps[step], file=sys.stderr)
    result = {
        "benchmark": "data_pipeline",
        "size": args.size,
        "sizes": GenerateConfig().sizes[args.size].model_dump(),
        "steps": steps,
        "targets": {
            "generate_under_s": TARGET_S,
            "generate_met": steps["generate"]["wall_s"] < TARGET_S,
            "validate_under_s": TARGET_S,
            "validate_met": steps["validate_paper"]["wall_s"] < TARGET_S,
        },
        "load_average_before_after": [round(x, 2) for x in (*load_before[:1], os.getloadavg()[0])],
        "note": "2-core machine shared with other helpers' tests and benchmarks while this ran; "
        "wall time includes waiting for the CPU (cpu_s is this process's own CPU time)",
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
