"""Article attributes (issue 14): train models with and without them on data the features stage already
wrote (features.article_features on), evaluate them and compare with both popularity baselines.

    python studies/article_features/article_features.py --params params.yaml --models none none_attrs \
        --combine sum concat --id-dropout 0 0.5 --max-epochs 20 --run planted

Each (model, combine, id dropout) trains one seed with the params' recipe (train_for(model), max_epochs overridden) by
the library's own training loop, and is evaluated by the evaluate stage's code (`evaluate_run`); "combine"
and "id dropout" (per_model.<model>_attrs.id_dropout; default: the params') only matter for "_attrs" models
(model.ArticleAttributes: sum vs concat + projection; ArticleAttributes.ids). Records one entry (--run) in the study's results.json:
per run the best validation cross-entropy, epochs, seconds, and the test metrics (all / known / unseen
targets, bootstrap intervals); and the two popularity baselines' test metrics.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from contextual_bert.config import load_config, uses_attributes
from contextual_bert.data import load_article_vocab, load_catalogue, load_spec, load_split
from contextual_bert.evaluation import evaluate_attribute_popularity, evaluate_popularity, evaluate_run
from contextual_bert.model import build_model, count_paper_parameters
from contextual_bert.training import fit

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import record  # noqa: E402

PARTS = ("test", "test_known", "test_unseen")
KEEP = ("n_cases", "n_outfits", "n_unknown_targets", "cross_entropy", "recall@1", "recall@5", "recall@10", "mrr")


def summary(result: dict) -> dict:
    out = {"ranked": result.get("ranked", "vocabulary")}
    for part in PARTS:
        if part in result:
            out[part] = {k: result[part].get(k) for k in KEEP if k in result[part]}
            boot = result.get(f"{part}_bootstrap") or {}
            out[part]["ci"] = {k: boot.get(k) for k in ("cross_entropy", "recall@5")}
    return out


def train_one(
    cfg,
    features_dir: Path,
    model_name: str,
    combine: str,
    seed: int,
    max_epochs: int,
    out_dir: Path,
    id_dropout: float | None = None,
):
    spec = load_spec(features_dir)
    catalogue = load_catalogue(features_dir) if uses_attributes(model_name) else None
    train_data = load_split(features_dir, "train", cfg.model.max_set_size, catalogue=catalogue is not None)
    val_data = load_split(features_dir, "val", cfg.model.max_set_size, catalogue=catalogue is not None)
    torch.manual_seed(seed)
    model = build_model(
        cfg.model_for(model_name),
        model_name,
        len(load_article_vocab(features_dir)),
        spec,
        None if catalogue is None else catalogue.spec,
        combine,
    )
    if catalogue is not None:
        model.set_catalogue(catalogue.tensors())
    update = {"max_epochs": max_epochs} | ({} if id_dropout is None else {"id_dropout": id_dropout})
    train_cfg = cfg.train_for(model_name).model_copy(update=update)
    started = time.perf_counter()
    log = lambda epoch, row: print(
        f"  {out_dir.name} epoch {epoch}: val {row['val_cross_entropy']:.4f} "  # noqa: E731
        f"train {row['train_cross_entropy']:.4f} ({row['seconds']:.0f} s)",
        flush=True,
    )
    metrics = fit(model, train_data, val_data, train_cfg, out_dir, seed, on_epoch_end=log)
    n_all = sum(p.numel() for p in model.parameters())
    return metrics, time.perf_counter() - started, count_paper_parameters(model), n_all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--models", nargs="+", default=["none", "none_attrs"])
    parser.add_argument("--combine", nargs="+", default=["sum"])
    parser.add_argument(
        "--id-dropout",
        nargs="+",
        type=float,
        default=None,
        help="id_dropout values for the _attrs models (default: the params')",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-epochs", type=int, default=20)
    parser.add_argument("--run", required=True, help="the run's key in the results file")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).with_name("results.json"),
        help="the results file (default: the study's results.json)",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs' checkpoints here (default: not kept)")
    args = parser.parse_args()
    cfg = load_config(args.params)
    features_dir = cfg.paths.features_dir
    manifest = json.loads((features_dir / "manifest.json").read_text())
    report = {
        "params": str(args.params),
        "source": manifest["source"],
        "rows": manifest["rows"],
        "catalogue": {k: v for k, v in manifest.get("catalogue", {}).items() if k != "spec"},
        "seed": args.seed,
        "max_epochs": args.max_epochs,
        "load": os.getloadavg(),
        "runs": {},
        "baselines": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp) if args.keep is None else args.keep
        tmp.mkdir(parents=True, exist_ok=True)
        report["baselines"]["popularity"] = summary(
            evaluate_popularity(features_dir, tmp / "p.json", cfg.evaluate, cfg.model.max_set_size)
        )
        attribute = evaluate_attribute_popularity(features_dir, tmp / "pa.json", cfg.evaluate, cfg.model.max_set_size)
        if attribute.get("known") is not False:
            report["baselines"]["popularity_attribute"] = summary(attribute) | {
                "attribute": attribute["attribute"],
                "in_outfit_share": attribute["in_outfit_share"],
            }
        for model_name in args.models:
            attrs = uses_attributes(model_name)
            for combine, id_dropout in itertools.product(
                args.combine if attrs else ["-"], (args.id_dropout or [None]) if attrs else [None]
            ):
                name = model_name if combine == "-" else f"{model_name}/{combine}"
                rate = cfg.train_for(model_name).id_dropout if id_dropout is None else id_dropout
                name += f"/id_dropout={rate:g}" if attrs else ""
                run_dir = tmp / name.replace("/", "_").replace("=", "")
                metrics, seconds, counted, n_all = train_one(
                    cfg,
                    features_dir,
                    model_name,
                    "sum" if combine == "-" else combine,
                    args.seed,
                    args.max_epochs,
                    run_dir,
                    id_dropout,
                )
                result = evaluate_run(features_dir, run_dir, tmp / f"{run_dir.name}.json", cfg.evaluate)
                history = json.loads((run_dir / "curve.json").read_text())
                report["runs"][name] = {
                    "best_val_cross_entropy": metrics["best_val_cross_entropy"],
                    "best_epoch": metrics["best_epoch"],
                    "epochs": metrics["epochs"],
                    "converged": metrics["converged"],
                    "seconds": round(seconds, 1),
                    "counted_parameters": counted,
                    "all_parameters": n_all,
                    "val_curve": [round(r["val_cross_entropy"], 4) for r in history],
                    **summary(result),
                }
                print(name, json.dumps(report["runs"][name]["test"]), flush=True)
                record(args.out, args.run, report)
    record(args.out, args.run, report)


if __name__ == "__main__":
    main()
