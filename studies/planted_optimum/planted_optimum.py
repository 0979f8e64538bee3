"""Is planted data a fair test? The optimum with and without context against popularity, at several sizes.

For every size, a project of its own under --workdir (params.yaml's settings, `ingest.source: planted`,
`planted.n_outfits` = the size, paths inside the project) runs the pipeline's own stages through the CLI:
ingest -> validate -> features -> baseline -> optimum. Records the test split's cross-entropy and recall@5
of popularity and of the optimum with and without context, the two gaps the issue asks for (optimum with
context at least 0.5 nats below popularity and at least 0.15 nats below the optimum without context, with
a vocabulary of at least 3,000 articles), and the seconds of each stage (the optimum's included).

    .venv/bin/python studies/planted_optimum/planted_optimum.py [--sizes 24000 150000] [--workdir DIR]

Records the result as `optimum_check` in studies/planted_optimum/results.json (--out).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import record  # noqa: E402

REQUIRED = {"min_vocabulary": 3000, "below_popularity": 0.5, "below_no_context": 0.15}


def run_size(base: dict, workdir: Path, size: int) -> dict:
    from contextual_bert.cli import main
    from contextual_bert.data import N_SPECIAL

    root = workdir / f"n{size}"
    root.mkdir(parents=True, exist_ok=True)
    params = json.loads(json.dumps(base))
    params["paths"] = {name: str(root / Path(value)) for name, value in base["paths"].items()}
    params["ingest"]["source"] = "planted"
    params.setdefault("planted", {})["n_outfits"] = size
    params_path = root / "params.yaml"
    params_path.write_text(yaml.safe_dump(params))
    seconds = {}
    for stage in ("ingest", "validate", "features", "baseline", "optimum"):
        started = time.perf_counter()
        if main(["--params", str(params_path), stage]) != 0:
            raise SystemExit(f"size {size}: `contextual-bert {stage}` failed")
        seconds[stage] = round(time.perf_counter() - started, 1)

    def test(name: str) -> dict:
        return json.loads((root / "reports" / "eval" / f"{name}.json").read_text())["test"]

    manifest = json.loads((root / "data" / "features" / "manifest.json").read_text())
    results = {name: test(name) for name in ("popularity", "optimum_context", "optimum_no_context")}
    vocabulary = manifest["n_items"] - N_SPECIAL
    ce = {name: r["cross_entropy"] for name, r in results.items()}
    gaps = {
        "below_popularity": ce["popularity"] - ce["optimum_context"],
        "below_no_context": ce["optimum_no_context"] - ce["optimum_context"],
    }
    return {
        "n_outfits": size,
        "rows": manifest["rows"],
        "vocabulary": vocabulary,
        "test": {
            name: {
                "cross_entropy": r["cross_entropy"],
                "recall@5": r["recall@5"],
                "n_cases": r["n_cases"],
                "n_unknown_targets": r["n_unknown_targets"],
            }
            for name, r in results.items()
        },
        "gaps": gaps,
        "fair_test": vocabulary >= REQUIRED["min_vocabulary"] and all(gaps[k] >= REQUIRED[k] for k in gaps),
        "seconds": seconds,
        "ingest_report": json.loads((root / "data" / "raw" / "ingest_report.json").read_text()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[24_000, 150_000])
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--out", type=Path, default=REPO / "studies/planted_optimum/results.json")
    args = parser.parse_args()
    base = yaml.safe_load(args.params.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        points = [run_size(base, workdir, size) for size in args.sizes]
    result = {
        "required": REQUIRED,
        "planted": base.get("planted", {}),
        "points": points,
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
    }
    record(args.out, "optimum_check", result)
    print(json.dumps([{k: p[k] for k in ("n_outfits", "gaps", "fair_test", "seconds")} for p in points], indent=2))


if __name__ == "__main__":
    main()
