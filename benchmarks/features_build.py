"""Time the features stage at the paper's size: 380k outfits, 100k customers, 30k articles.

Writes reports/benchmarks/features.json: seconds for build_features and for load_split of each split,
and the peak resident memory of this process. The input is random data with the paper's columns
(built here with numpy, so the benchmark does not depend on the generator).

    .venv/bin/python benchmarks/features_build.py [--outfits 380000] [--customers 100000] [--articles 30000]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from contextual_bert.config import load_config
from contextual_bert.data import PAPER_SCHEMA, build_features, load_split

REPO = Path(__file__).resolve().parents[1]


def _lists(rng, n_rows, options, low, high):
    lengths = rng.integers(low, high + 1, n_rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = np.asarray(options, dtype=object)[rng.integers(0, len(options), offsets[-1])]
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.tolist(), type=pa.string()))


def write_paper_sized(directory: Path, n_outfits: int, n_customers: int, n_articles: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    article_ids = np.array([f"a{i:06d}" for i in range(n_articles)], dtype=object)
    pq.write_table(
        pa.table(
            {
                "article_id": article_ids.tolist(),
                "product_type": rng.choice([f"type_{i}" for i in range(40)], n_articles).tolist(),
                "brand": rng.choice([f"brand_{i}" for i in range(500)], n_articles).tolist(),
                "color": rng.choice([f"color_{i}" for i in range(30)], n_articles).tolist(),
                "style": rng.choice([f"style_{i}" for i in range(20)], n_articles).tolist(),
                "price": rng.uniform(5, 300, n_articles),
            }
        ),
        directory / "articles.parquet",
    )
    age = rng.integers(18, 80, n_customers).astype(float)
    age[rng.random(n_customers) < 0.05] = np.nan
    pq.write_table(
        pa.table(
            {
                "customer_id": [f"c{i:07d}" for i in range(n_customers)],
                "age": age,
                "gender": rng.choice(["f", "m", "d"], n_customers).tolist(),
                "country": rng.choice([f"country_{i}" for i in range(15)], n_customers).tolist(),
                "preferred_brands": _lists(rng, n_customers, [f"brand_{i}" for i in range(500)], 0, 10),
                "preferred_colors": _lists(rng, n_customers, [f"color_{i}" for i in range(30)], 0, 4),
                "preferred_styles": _lists(rng, n_customers, [f"style_{i}" for i in range(20)], 0, 3),
                "nogo_product_types": _lists(rng, n_customers, [f"type_{i}" for i in range(40)], 0, 3),
                "size_top": rng.choice(["XS", "S", "M", "L", "XL"], n_customers).tolist(),
                "size_bottom": rng.choice([str(s) for s in range(30, 46, 2)], n_customers).tolist(),
                "size_shoes": rng.choice([str(s) for s in range(35, 47)], n_customers).tolist(),
                "price_min": rng.uniform(5, 50, n_customers),
                "price_max": rng.uniform(50, 500, n_customers),
            }
        ),
        directory / "customers.parquet",
    )
    sizes = rng.integers(4, 9, n_outfits)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    popularity = rng.zipf(1.3, offsets[-1]) % n_articles  # long-tailed, as real outfits are
    pq.write_table(
        pa.table(
            {
                "outfit_id": [f"o{i:07d}" for i in range(n_outfits)],
                "customer_id": [f"c{i:07d}" for i in rng.integers(0, n_customers, n_outfits)],
                "article_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(article_ids[popularity].tolist())),
                "occasion": rng.choice([f"occasion_{i}" for i in range(12)], n_outfits).tolist(),
            }
        ),
        directory / "outfits.parquet",
    )
    PAPER_SCHEMA.save(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outfits", type=int, default=380_000)
    parser.add_argument("--customers", type=int, default=100_000)
    parser.add_argument("--articles", type=int, default=30_000)
    parser.add_argument("--out", type=Path, default=REPO / "reports/benchmarks/features.json")
    args = parser.parse_args()
    cfg = load_config(REPO / "params.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        validated, features = Path(tmp) / "validated", Path(tmp) / "features"
        write_paper_sized(validated, args.outfits, args.customers, args.articles)
        start = time.perf_counter()
        manifest = build_features(validated, features, cfg.features, max_set_size=cfg.model.max_set_size)
        build_s = time.perf_counter() - start
        load_s = {}
        for split in ("train", "val", "test"):
            start = time.perf_counter()
            load_split(features, split, cfg.model.max_set_size)
            load_s[split] = round(time.perf_counter() - start, 3)
    result = {
        "benchmark": "features_build",
        "sizes": {"outfits": args.outfits, "customers": args.customers, "articles": args.articles},
        "build_features_s": round(build_s, 3),
        "load_split_s": load_s,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rows": manifest["rows"],
        "n_items": manifest["n_items"],
        "d_context": manifest["d_context"],
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": __import__("os").cpu_count(),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
