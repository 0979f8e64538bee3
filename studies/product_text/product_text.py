"""Product text (issue 43): the same attribute models with and without text attributes, paired on the same test
cases, unseen targets apart.

    python studies/product_text/product_text.py --without <params: attributes without text> --with <params: the same plus
        text attributes> --models none_attrs global_state_attrs --seeds 0 1 2 --out <dir> --run <name>

Both params files must describe the same data and split (their features stages already run: only the declared
article attributes differ). Each (params, model, seed) trains by the pipeline's own `training.train` and is
evaluated by the evaluate stage's `evaluate_run` (FITB included); then, per model, the runs with text are paired
with those without on the same test outfits (bootstrap.paired_difference over the mean of the seeds' per-outfit
sums), for all targets, the targets with an id embedding (known) and those without (unseen). Records the report
as --run in the study's results.json (--results); the runs' evaluation JSONs under <out>/eval/.

    python studies/product_text/product_text.py --summarize <run> ...   # results.json's runs' tables, as markdown
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from contextual_bert.config import load_config
from contextual_bert.data import load_catalogue, load_split
from contextual_bert.evaluation import (
    PROTOCOLS,
    answer,
    case_ranks,
    case_values,
    evaluate_run,
    mean_record,
    outfit_record,
    paired_difference,
    split_questions,
)
from contextual_bert.model import load_checkpoint
from contextual_bert.training import train

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import record  # noqa: E402

RESULTS = Path(__file__).with_name("results.json")

PARTS = ("all", "known", "unseen")
PAIRED = ("cross_entropy", "recall@5", "recall@10", "fitb_easy", "fitb_hard")


def records(cfg, run_dir: Path) -> dict[str, dict]:
    """Per part (all / known / unseen targets) the per-outfit record of the test cases' values, FITB included
    (all targets)."""
    features_dir = cfg.paths.features_dir
    model, _ = load_checkpoint(run_dir / "checkpoint.pt")
    catalogue = load_catalogue(features_dir)
    model.set_catalogue(catalogue.tensors())
    data = load_split(features_dir, "test", cfg.model.max_set_size, catalogue=True)
    cases = case_ranks(model, data, cfg.evaluate.batch_size, "cpu")
    values = case_values(cases["rank"], cases["log_prob"])
    values["recall@10"] = (cases["rank"] <= 10).astype(np.float64)
    ids = list(data.outfit_ids)
    known = cases["target"] < catalogue.n_ids
    out = {}
    for part, keep in (("all", np.ones_like(known)), ("known", known), ("unseen", ~known)):
        out[part] = outfit_record(cases["outfit"][keep], {m: v[keep] for m, v in values.items()}, ids)
    questions, _, _ = split_questions(features_dir, cfg.model.max_set_size, cfg.evaluate.fitb)
    correct = answer(model, data, questions, cfg.evaluate.batch_size, "cpu")
    for protocol in PROTOCOLS:
        asked = questions.asked[protocol]
        out[f"fitb_{protocol}"] = outfit_record(
            questions.outfit[asked], {f"fitb_{protocol}": correct[protocol][asked]}, ids
        )
    return out


def summary_table(reports: list[dict]) -> str:
    """Markdown: per model and arm the mean over seeds of each run's metrics, then the paired differences."""
    lines = [
        "| model | text | seeds | best val CE | CE all | CE known | CE unseen | R@10 unseen % | FITB easy % | "
        "FITB hard % |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    for report in reports:
        for model in report["models"]:
            for arm in ("without_text", "with_text"):
                runs = [r for k, r in report["runs"].items() if k.startswith(f"{arm}/{model}/")]
                if not runs:
                    continue
                lines.append(
                    " | ".join(
                        [
                            f"| {model}",
                            "yes" if arm == "with_text" else "no",
                            str(len(runs)),
                            f"{mean([r['best_val_cross_entropy'] for r in runs]):.3f}",
                            *(f"{mean([r[part]['cross_entropy'] for r in runs]):.3f}" for part in PARTS),
                            f"{100 * mean([r['unseen']['recall@10'] for r in runs]):.1f}",
                            *(f"{100 * mean([r['fitb'][p] for r in runs]):.1f}" for p in PROTOCOLS),
                        ]
                    )
                    + " |"
                )
    lines += [
        "",
        "| model | targets | metric | with - without text | 95% CI (paired, test outfits) |",
        "|---|---|---|---|---|",
    ]
    for report in reports:
        for model, parts in report.get("paired", {}).items():
            for part, metrics in parts.items():
                for metric, d in metrics.items():
                    scale = 100 if metric != "cross_entropy" else 1
                    ci = (
                        "–"
                        if d["interval"] is None
                        else f"{d['interval'][0] * scale:+.3f} .. {d['interval'][1] * scale:+.3f}"
                    )
                    value = "–" if d["difference"] is None else f"{d['difference'] * scale:+.3f}"
                    lines.append(
                        f"| {model} | {part} | {metric}{' (points)' if scale == 100 else ' (nats)'} | {value} | {ci} |"
                    )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--summarize":  # runs of the results file -> markdown tables
        results = json.loads(RESULTS.read_text())
        print(summary_table([results[run] for run in sys.argv[2:]]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--without", type=Path, required=True, help="params: the attributes without text")
    parser.add_argument("--with", dest="with_", type=Path, required=True, help="params: the same plus text")
    parser.add_argument("--models", nargs="+", default=["none_attrs", "global_state_attrs"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True, help="a work folder: the runs' evaluation JSONs")
    parser.add_argument("--run", required=True, help="the report's key in --results")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    configs = {"without_text": load_config(args.without), "with_text": load_config(args.with_)}
    report = {
        "params": {k: str(v) for k, v in (("without_text", args.without), ("with_text", args.with_))},
        "models": args.models,
        "seeds": args.seeds,
        "runs": {},
        "paired": {},
        "load_before": os.getloadavg(),
    }
    for arm, cfg in configs.items():
        manifest = json.loads((cfg.paths.features_dir / "manifest.json").read_text())
        report[arm] = {
            "attributes": {f["name"]: f["kind"] for f in manifest["catalogue"]["spec"]},
            "cardinality": {f["name"]: f["cardinality"] for f in manifest["catalogue"]["spec"]},
            "rows": manifest["rows"],
            "catalogue_unknown": manifest["catalogue"]["unknown"],
        }
    per_run: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model_name in args.models:
            for seed in args.seeds:
                for arm, cfg in configs.items():
                    run_dir = Path(tmp) / f"{arm}-{model_name}-s{seed}"
                    started = time.perf_counter()
                    metrics = train(
                        cfg.paths.features_dir,
                        run_dir,
                        model_name,
                        seed,
                        cfg.model_for(model_name),
                        cfg.train_for(model_name),
                    )
                    seconds = time.perf_counter() - started
                    result = evaluate_run(
                        cfg.paths.features_dir,
                        run_dir,
                        args.out / "eval" / f"{arm}-{model_name}-s{seed}.json",
                        cfg.evaluate,
                    )
                    key = f"{arm}/{model_name}/s{seed}"
                    report["runs"][key] = {
                        "best_val_cross_entropy": metrics["best_val_cross_entropy"],
                        "best_epoch": metrics["best_epoch"],
                        "epochs": metrics["epochs"],
                        "converged": metrics["converged"],
                        "seconds": round(seconds, 1),
                        **{
                            part: {
                                m: result[f"test_{part}" if part != "all" else "test"].get(m)
                                for m in ("n_cases", "cross_entropy", "recall@5", "recall@10")
                            }
                            for part in PARTS
                        },
                        "fitb": {p: result["fitb"][p].get("accuracy") for p in PROTOCOLS},
                    }
                    per_run.setdefault((arm, model_name), []).append(records(cfg, run_dir))
                    print(key, json.dumps(report["runs"][key]), flush=True)
                    record(args.results, args.run, report)
            for part in (*PARTS, "fitb_easy", "fitb_hard"):
                metrics = [part] if part.startswith("fitb") else [m for m in PAIRED if not m.startswith("fitb")]
                mean = {arm: mean_record([r[part] for r in per_run[(arm, model_name)]]) for arm in configs}
                for metric in metrics:
                    report["paired"].setdefault(model_name, {}).setdefault(part, {})[metric] = paired_difference(
                        mean["with_text"], mean["without_text"], metric
                    )
        report["load_after"] = os.getloadavg()
    record(args.results, args.run, report)


if __name__ == "__main__":
    main()
