"""Serving an attribute model ("<model>_attrs") with articles added after training: what it costs.

Loads a trained checkpoint's serving core (`serving.OutfitCompleterCore`) twice, as `mlflow models serve` does:
with the catalogue it was trained with, and with --new articles appended (CONTEXTUAL_BERT_CATALOGUE's path:
`catalogue=`), each a copy of a random existing article's attribute values under a new id. Measured: load
time of each, and the latency of a one-row request whose outfit holds a new article (serving_latency.timed:
p50 and p99 over --requests, after a warm-up), against the same request with the trained catalogue. Writes
reports/benchmarks/catalogue_extension.json.

    .venv/bin/python benchmarks/catalogue_extension.py --project /tmp/lc-attrs/n20000 --model none_attrs-s0
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml
from serving_latency import timed

from contextual_bert.data import N_SPECIAL
from contextual_bert.serving import OutfitCompleterCore

REPO = Path(__file__).resolve().parents[1]


def timed_load(checkpoint: Path, features: Path, catalogue: Path | None) -> tuple[OutfitCompleterCore, float]:
    started = time.perf_counter()
    core = OutfitCompleterCore.load(checkpoint, features, device="cpu", catalogue=catalogue)
    return core, time.perf_counter() - started


def latency_ms(core: OutfitCompleterCore, request: pd.DataFrame, n: int) -> dict:
    return timed(lambda i: core.recommend(request, 10), n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, required=True, help="a project folder (params.yaml, data, models)")
    parser.add_argument("--model", default="none_attrs-s0", help="run folder under the project's models_dir")
    parser.add_argument("--new", type=int, default=1000, help="articles added after training")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "benchmarks" / "catalogue_extension.json")
    args = parser.parse_args()
    torch.set_num_threads(1)

    paths = yaml.safe_load((args.project / "params.yaml").read_text())["paths"]
    checkpoint = Path(paths["models_dir"]) / args.model / "checkpoint.pt"
    features = Path(paths["features_dir"])
    articles = pd.read_parquet(Path(paths["validated_dir"]) / "articles.parquet")
    rng = np.random.default_rng(0)
    new = articles.iloc[rng.integers(0, len(articles), args.new)].copy()
    new["article_id"] = [f"new-{i}" for i in range(args.new)]

    trained, load_trained = timed_load(checkpoint, features, None)
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "articles.parquet"
        pd.concat([articles, new]).to_parquet(table)
        extended, load_extended = timed_load(checkpoint, features, table)
    known = list(trained.article_vocab.ids[N_SPECIAL : N_SPECIAL + 3])
    result = {
        "checkpoint": str(checkpoint),
        "variant": trained.model.name,
        "outfit_offsets": getattr(trained.model, "overlap", None) is not None,
        "articles": {
            "catalogue_at_training": trained.model.n_items - N_SPECIAL,
            "added": args.new,
            "served": extended.model.n_items - N_SPECIAL,
        },
        "load_seconds": {"trained_catalogue": round(load_trained, 3), "extended_catalogue": round(load_extended, 3)},
        "one_row_request_ms": {
            "trained_catalogue": latency_ms(trained, pd.DataFrame({"article_ids": [known]}), args.requests),
            "extended_catalogue_new_article_in_outfit": latency_ms(
                extended, pd.DataFrame({"article_ids": [[new["article_id"].iloc[0], *known[:2]]]}), args.requests
            ),
        },
        "torch_threads": 1,
        "machine": platform.processor() or platform.machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
