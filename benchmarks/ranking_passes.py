"""The passes that rank the whole catalogue at 105k articles, before and after issue 58, in turns.

Three passes, each as training runs them (`training.loop.validation_cross_entropy`: `ranking.case_ranks` with
with_ranks=False; `training.warmup.stuck_check`: the same with dependence=True), on ~1,000 generated validation
outfits of 4-8 articles with random customer contexts (the paper's 13 features, d_context 736), batches of
4 x train.batch_size (params.yaml: 64) = 256 cases, one torch thread:

- ids_validation: [GS] of ids ranking a vocabulary of 105k articles (every catalogue article occurs in
  training: the ids model ranks as many articles as the attribute model);
- attrs_validation: [GS] + attributes ranking the 105k-article catalogue (six categorical attributes with
  H&M's cardinalities, as benchmarks/train_throughput_catalogue.py builds them; every article with an id;
  the attribute overlap on, its offsets drawn nonzero so that they are not all zero as at initialisation);
- attrs_stuck_check: the attribute model's one-off stuck check (the validation pass plus the pass with the
  encoder reading other outfits).

Untrained models (the cost of a pass does not depend on the weights); glibc told to keep freed memory, as
training and evaluation run (devices.keep_freed_memory). "before" is the code at a git commit
(`--before`, a worktree: `git worktree add --detach /tmp/before <commit>`), "after" this tree's src; each pass
runs in a process of its own (its peak resident memory its own), before and after in turns (the order swapped
every round), `--rounds` rounds. Every pass also records its mean log-probability and outfit dependence, so
that before and after are seen to compute the same numbers. Writes reports/benchmarks/ranking_passes.json:
per round and code the seconds (wall and CPU) of each pass, the medians, and the ratios the issue sets as
targets (attrs_validation / ids_validation <= 2; attrs_stuck_check / attrs_validation <= 2).

    nice -n 5 .venv/bin/python benchmarks/ranking_passes.py --before /tmp/before/src [--rounds 3] [--outfits 1000]
        [--articles 105000] [--passes ...] [--append]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "reports" / "benchmarks" / "ranking_passes.json"
PASSES = ("ids_validation", "attrs_validation", "attrs_stuck_check")
ATTRIBUTES = [("product_type", 130), ("colour", 50), ("appearance", 30), ("section", 60), ("index_group", 10),
              ("garment_group", 25)]  # fmt: skip
TRAIN_BATCH = 64  # params.yaml train.batch_size: validation and the stuck check take 4x as many cases a batch
TARGETS = {"attrs_validation / ids_validation": 2.0, "attrs_stuck_check / attrs_validation": 2.0}


def run_pass(name: str, n_articles: int, n_outfits: int, threads: int) -> dict:
    """One pass in this process (the code on sys.path): seconds, CPU seconds, peak RSS and what it computed."""
    import torch

    from contextual_bert.config import ModelConfig
    from contextual_bert.data import N_SPECIAL, PAD_INDEX, ContextSpec, EncodedOutfits, FeatureSpec
    from contextual_bert.devices import keep_freed_memory
    from contextual_bert.model import AttributeOverlap, build_model
    from contextual_bert.training import stuck_check, validation_cross_entropy

    sys.path.insert(0, str(REPO / "benchmarks"))
    import train_throughput as tt  # the paper's 13 context features (SPEC)

    torch.set_num_threads(threads)
    keep_freed_memory()  # as training and evaluation run on the CPU (devices.py): no page faults per fresh tensor
    n_items = N_SPECIAL + n_articles
    model_cfg = ModelConfig(d_model=128, n_blocks=4, n_heads=8, d_ff=256, dropout=0.1, max_set_size=8)
    attrs = name.startswith("attrs")
    spec = ContextSpec(tuple(FeatureSpec(a, "categorical", "article", N_SPECIAL + card, 16) for a, card in ATTRIBUTES))
    torch.manual_seed(0)
    model = build_model(model_cfg, "global_state_attrs" if attrs else "global_state", n_items, tt.SPEC,
                        spec if attrs else None)  # fmt: skip
    g = torch.Generator().manual_seed(1)
    if attrs:
        model.set_catalogue({f.name: torch.randint(N_SPECIAL, f.cardinality, (n_items,), generator=g)
                             for f in spec.features})  # fmt: skip
        with torch.no_grad():
            for offset in model.reader(AttributeOverlap).offsets:
                offset.normal_(std=0.05, generator=g)
    items = torch.randint(N_SPECIAL, n_items, (n_outfits, 8), generator=g)
    items[torch.arange(8) >= torch.randint(4, 9, (n_outfits, 1), generator=g)] = PAD_INDEX
    context = {}
    for f in tt.SPEC.features:
        shape = (n_outfits, f.max_values) if f.kind == "multi_categorical" else (n_outfits,)
        context[f.name] = torch.randint(0 if f.kind == "multi_categorical" else 1, f.cardinality, shape, generator=g)
    data = EncodedOutfits(items, context)
    batch = 4 * TRAIN_BATCH
    validation_cross_entropy(model, data.subset(torch.arange(20)), batch, "cpu")  # warm-up: first-call costs
    started, cpu_started = time.perf_counter(), time.process_time()
    if name == "attrs_stuck_check":
        check = stuck_check(model, data, batch, "cpu", epoch=1)
        result = {"outfit_dependence": check["outfit_dependence"]}
    else:
        result = {"cross_entropy": validation_cross_entropy(model, data, batch, "cpu")}
    return {
        "seconds": round(time.perf_counter() - started, 2),
        "cpu_seconds": round(time.process_time() - cpu_started, 2),
        "cases": int((items != PAD_INDEX).sum()),
        **result,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def summarise(report: dict) -> None:
    """Medians over the rounds per code and pass, and the target ratios from them."""
    summary = {}
    for code in ("before", "after"):
        rows = [r for r in report["rounds"] if r["code"] == code]
        medians = {p: round(statistics.median(r["passes"][p]["seconds"] for r in rows if p in r["passes"]), 2)
                   for p in PASSES if any(p in r["passes"] for r in rows)}  # fmt: skip
        cpu = {
            p: round(statistics.median(r["passes"][p]["cpu_seconds"] for r in rows if p in r["passes"]), 2)
            for p in medians
        }
        ratios = {}
        if {"attrs_validation", "ids_validation"} <= medians.keys():
            ratios["attrs_validation / ids_validation"] = round(
                medians["attrs_validation"] / medians["ids_validation"], 2
            )
        if {"attrs_stuck_check", "attrs_validation"} <= medians.keys():
            ratios["attrs_stuck_check / attrs_validation"] = round(
                medians["attrs_stuck_check"] / medians["attrs_validation"], 2
            )
        summary[code] = {"median_seconds": medians, "median_cpu_seconds": cpu, "ratios": ratios,
                         "meets_targets": {k: v <= TARGETS[k] for k, v in ratios.items()}}  # fmt: skip
    if summary.get("before", {}).get("median_seconds") and summary["after"]["median_seconds"]:
        summary["speed_up"] = {
            p: round(summary["before"]["median_seconds"][p] / summary["after"]["median_seconds"][p], 2)
            for p in summary["after"]["median_seconds"]
            if p in summary["before"]["median_seconds"]
        }
    report["summary"] = summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=False, help="the src folder of the code before")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--outfits", type=int, default=1000)
    parser.add_argument("--articles", type=int, default=105_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--passes", nargs="+", default=list(PASSES))
    parser.add_argument("--codes", nargs="+", default=["before", "after"])
    parser.add_argument("--append", action="store_true", help="add rounds to --out instead of starting it anew")
    parser.add_argument("--note", default="")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: a pass, in its own process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_pass(args.one, args.articles, args.outfits, args.threads)))
        return
    sources = {"before": args.before, "after": REPO / "src"}
    report = json.loads(args.out.read_text()) if args.append and args.out.exists() else {"rounds": []}
    commit = subprocess.run(["git", "-C", str(args.before), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() if args.before else None  # fmt: skip
    report.update({
        "what": "one validation pass (ranking.case_ranks, with_ranks=False, as training.loop.validation_cross_entropy) "
                "of [GS] + attributes and of [GS] of ids, and the attribute model's one-off stuck check "
                "(training.warmup.stuck_check: dependence=True), at 105k articles ranked; before and after issue 58 "
                "in turns, each pass in its own process",
        "settings": {"articles": args.articles, "validation_outfits": args.outfits, "batch_cases": 4 * TRAIN_BATCH,
                     "threads": args.threads, "attributes": dict(ATTRIBUTES), "attribute_overlap": True,
                     "model": "d_model 128, 4 blocks, 8 heads, d_ff 256, d_context 736 (the paper's sizes), untrained",
                     "ids_model_vocabulary": args.articles, "every_article_has_an_id": True},
        "before": {"commit": commit, "src": str(args.before)} if args.before else None,
        "machine": {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "platform": platform.platform()},
        "targets": TARGETS,
        "note": args.note,
    })  # fmt: skip
    first_round = 1 + max((r["round"] for r in report["rounds"]), default=0)
    for number in range(first_round, first_round + args.rounds):
        codes = args.codes if number % 2 else args.codes[::-1]
        rows = {code: {"round": number, "code": code, "passes": {}, "load_average_before": None} for code in codes}
        for code in codes:
            rows[code]["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
        for name in args.passes:
            for code in codes:
                env = {**os.environ, "PYTHONPATH": str(sources[code]), "OMP_NUM_THREADS": str(args.threads)}
                proc = subprocess.run([sys.executable, __file__, "--one", name, "--articles", str(args.articles),
                                       "--outfits", str(args.outfits), "--threads", str(args.threads)],
                                      env=env, capture_output=True, text=True)  # fmt: skip
                if proc.returncode != 0:
                    raise SystemExit(f"{code} {name} failed:\n{proc.stderr[-3000:]}")
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                row["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
                rows[code]["passes"][name] = row
                print(number, code, name, row, flush=True)
        report["rounds"] += [rows[code] for code in codes]
        summarise(report)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=2))


if __name__ == "__main__":
    main()
