"""The whole run, not the step (issue 58, item 2): one `dvc repro` of a model on a generated H&M-format set with a
105k-article catalogue, from the import to Table 1, with the time of every stage and of each epoch's parts.

What it does, in a project folder of its own (default /tmp/whole_run/<model>_<outfits>; outside git):

1. Generates H&M-format files (benchmarks/hm_full_size.py's generator, scaled): articles.csv with all of
   Kaggle's columns and 105,542 articles, customers.csv, and transactions_train.csv whose baskets (a customer's
   purchases on one day) give about `--outfits` outfits of 4-8 distinct articles over 734 days, customers with
   several outfits each (a history). Reused when the folder already holds them.
2. Writes the project: a copy of this tree's dvc.yaml and src/ (the code under test, frozen for the run), and
   params.yaml = this tree's with ingest.source hm, the time split, the history on, train.models [--model]
   (default global_state_attrs: [GS] + attributes with history), one seed, train.max_epochs --epochs (8),
   train.num_threads --threads (1), MLflow in the folder; `--set key=value` for anything else (as the studies).
3. Runs `dvc repro report` there (source, ingest, validate, features, train, baseline, evaluate, optimum, report),
   every stage's Python process instrumented from outside the library (a sitecustomize on PYTHONPATH that
   wraps functions after import and writes JSON lines): per process its command, wall seconds and peak
   resident memory; per epoch the seconds of its parts, train (an epoch's steps in training.trainer.Trainer.fit), validation and the
   training probe (the two validation_cross_entropy calls of validate_epoch) and the stuck check
   (training.warmup.stuck_check); per ranking pass (ranking.case_ranks, fitb.answer) its seconds.

Writes --out (default reports/benchmarks/whole_run.json): the settings, the data's size, the stage and epoch
table, peak memory, the totals against the issue's targets (the run within 60 minutes, peak memory within 8 GiB,
an epoch's validation + probe at most half its training), and the machine's load around the run.

At the issue's size (100k outfits, 8 epochs) the run takes up to an hour of both cores:

    nice -n 5 .venv/bin/python benchmarks/whole_run.py [--outfits 100000] [--epochs 8] [--model global_state_attrs]

A small run that shows it works (a few minutes):

    nice -n 5 .venv/bin/python benchmarks/whole_run.py --outfits 5000 --epochs 2 \
        --set train.bag_warmup_check_steps=50 --out /tmp/whole_run_small.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "studies"))
import hm_full_size as hm  # noqa: E402  (the H&M-format generator)
from project import override  # noqa: E402  (studies/project.py: --set key.path=value)

OUT = REPO / "reports" / "benchmarks" / "whole_run.json"
OUTFITS_PER_TRANSACTION = 0.28 / 3.3  # baskets of 1 + geometric(mean 3.3) rows: 28% hold 4-8 articles
TARGETS = {"total_minutes": 60.0, "peak_rss_gib": 8.0, "validation_and_probe_over_training": 0.5}

# Every stage's Python process loads this first (PYTHONPATH): it wraps the library's functions once their
# modules are imported and writes one JSON line per measured call to $WHOLE_RUN_LOG. Nothing in the library
# knows of it.
SITECUSTOMIZE = r"""
import atexit, importlib.abc, json, os, resource, sys, time

_LOG = os.environ.get("WHOLE_RUN_LOG")
_STARTED = time.perf_counter()


def _write(record):
    with open(_LOG, "a") as out:
        out.write(json.dumps({"pid": os.getpid(), "t": time.time(), **record}) + "\n")


def _timed(record, fn, *args, **kwargs):
    started = time.perf_counter()
    out = fn(*args, **kwargs)
    _write({**record, "seconds": round(time.perf_counter() - started, 3)})
    return out


def _patch_trainer(trainer):
    # "train": an epoch's steps, from drawing its batches to its validation row; then the row's ranking passes
    state = {"calls": None}
    draw_batches, validated_row = trainer.Trainer.draw_batches, trainer.Trainer.validated_row
    validation = trainer.validation_cross_entropy

    def timed_draw_batches(self, epoch, *args):
        state["epoch"], state["steps_from"] = epoch, time.perf_counter()
        return draw_batches(self, epoch, *args)

    def timed_validated_row(self, *args):
        _write({"part": "train", "epoch": state["epoch"], "outfits": len(self.run.data.train),
                "seconds": round(time.perf_counter() - state["steps_from"], 3)})
        state["calls"] = 0
        try:
            return validated_row(self, *args)
        finally:
            state["calls"] = None

    def timed_validation(model, data, *args):
        part = "validation (outside an epoch)"
        if state["calls"] is not None:
            part = ("validation", "probe")[min(state["calls"], 1)]
            state["calls"] += 1
        return _timed({"part": part, "epoch": state.get("epoch"), "outfits": len(data)}, validation, model, data, *args)

    trainer.Trainer.draw_batches, trainer.Trainer.validated_row = timed_draw_batches, timed_validated_row
    trainer.validation_cross_entropy = timed_validation


def _patch_warmup(warmup):  # warmup_hook: where the Trainer calls the stuck check
    stuck_check = warmup.stuck_check

    def timed_stuck_check(model, data, batch_size, device, epoch):
        return _timed({"part": "stuck_check", "epoch": epoch, "outfits": len(data)}, stuck_check, model, data,
                      batch_size, device, epoch)

    warmup.stuck_check = timed_stuck_check


def _patch_ranking(ranking):
    case_ranks = ranking.case_ranks

    def timed(model, data, batch_size, device, with_ranks=True, dependence=False):
        name = getattr(model, "name", None) or type(model).__name__
        return _timed({"pass": "case_ranks", "model": name, "outfits": len(data), "with_ranks": with_ranks,
                       "dependence": dependence}, case_ranks, model, data, batch_size, device, with_ranks, dependence)

    ranking.case_ranks = timed


def _patch_fitb(fitb):
    answer = fitb.answer

    def timed(model, data, questions, batch_size, device):
        name = getattr(model, "name", None) or type(model).__name__
        return _timed({"pass": "fitb", "model": name, "questions": len(questions.outfit)}, answer, model, data,
                      questions, batch_size, device)

    fitb.answer = timed


_PATCHES = {"contextual_bert.training.trainer": _patch_trainer, "contextual_bert.training.warmup_hook": _patch_warmup,
            "contextual_bert.evaluation.ranking": _patch_ranking,
            "contextual_bert.evaluation.fitb": _patch_fitb}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _PATCHES[name](module)

        spec.loader.exec_module = exec_and_patch
        return spec


if _LOG:
    sys.meta_path.insert(0, _Finder())

    @atexit.register
    def _at_exit():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        _write({"process": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv)),
                "seconds": round(time.perf_counter() - _STARTED, 2), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
                "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)})
"""


def generate(folder: Path, outfits: int, seed: int) -> dict:
    """H&M-format files with about `outfits` outfits (hm_full_size.generate at another size), reused if there."""
    marker = folder / "generated.json"
    if marker.exists() and json.loads(marker.read_text()).get("outfits_asked") == outfits:
        return json.loads(marker.read_text())
    hm.N_TRANSACTIONS = int(outfits / OUTFITS_PER_TRANSACTION)
    hm.N_CUSTOMERS = max(500, outfits // 4)  # a customer has about 4 outfits: a history to read
    started = time.perf_counter()
    generated = hm.generate(folder, seed) | {
        "outfits_asked": outfits,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    marker.write_text(json.dumps(generated))
    return generated


def project_params(data: Path, root: Path, args) -> dict:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["ingest"]["source"] = "hm"
    params["import_hm"]["source"] = str(data)
    params["features"]["split"] = "time"
    params["features"]["history"]["enabled"] = True
    params["features"]["article_features"] = True
    params["train"].update(models=[args.model], seeds=[0], max_epochs=args.epochs, num_threads=args.threads)
    params["mlflow"]["tracking_uri"] = f"sqlite:///{root / 'mlflow.db'}"
    for assignment in args.set:
        override(params, assignment)
    return params


def write_project(root: Path, params: dict) -> None:
    """dvc.yaml, src/ (a copy: the code under test, frozen), params.yaml and a DVC repository without git."""
    if (root / "src").exists():
        shutil.rmtree(root / "src")
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "instrument").mkdir(exist_ok=True)
    (root / "instrument" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    if not (root / ".dvc").exists():
        dvc = str(Path(sys.executable).parent / "dvc")
        subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=root, check=True)
        subprocess.run([dvc, "config", "core.analytics", "false"], cwd=root, check=True)


def run_repro(root: Path, log: Path) -> dict:
    """`dvc repro report` in the project; the time at which each stage started (from DVC's output)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root / "instrument"), str(root / "src")]),
        "WHOLE_RUN_LOG": str(log),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }
    started = time.perf_counter()
    stages, lines = [], []
    proc = subprocess.Popen([str(Path(sys.executable).parent / "dvc"), "repro", "report"], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    for line in proc.stdout:
        lines.append(line)
        found = re.match(r"Running stage '([^']+)'", line.strip())
        if found:
            stages.append({"stage": found.group(1), "started_s": round(time.perf_counter() - started, 1)})
            print(f"[{time.perf_counter() - started:7.1f} s] {found.group(1)}", flush=True)
    code = proc.wait()
    total = round(time.perf_counter() - started, 1)
    (root / "repro.log").write_text("".join(lines))
    if code != 0:
        raise SystemExit(f"dvc repro failed ({code}); its output: {root / 'repro.log'}\n{''.join(lines[-40:])}")
    for stage, after in zip(stages, stages[1:] + [{"started_s": total}]):
        stage["seconds"] = round(after["started_s"] - stage["started_s"], 1)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"total_s": total, "stages": stages, "peak_rss_mib_any_process": round(children.ru_maxrss / 1024, 1)}


def summarise(records: list[dict], repro: dict, root: Path) -> dict:
    """The stage table (DVC's stage order, each stage's process: seconds and peak memory), the epoch table,
    the ranking passes, and the targets."""
    processes = [r for r in records if r.get("process", "").startswith("contextual-bert")]  # not DVC's own
    stages = []
    for stage in repro["stages"]:
        name = stage["stage"]
        command = name.split("@")[0]
        match = next((r for r in processes if f" {command}" in f" {r['process']}" and
                      (("@" not in name) or name.split("@")[1].rsplit("-", 1)[0] in r["process"])), None)  # fmt: skip
        stages.append({**stage, **({k: match[k] for k in ("cpu_seconds", "peak_rss_mib")} if match else {})})
    epochs = {}
    for r in records:
        if r.get("part") in ("train", "validation", "probe", "stuck_check") and r.get("epoch") is not None:
            epochs.setdefault(r["epoch"], {"epoch": r["epoch"]})[f"{r['part']}_s"] = r["seconds"]
            if r["part"] == "train":
                epochs[r["epoch"]]["train_outfits"] = r["outfits"]
            if r["part"] == "validation":
                epochs[r["epoch"]]["validation_outfits"] = r["outfits"]
    for row in epochs.values():
        if "train_s" in row and "validation_s" in row and "probe_s" in row:
            row["validation_and_probe_over_training"] = round(
                (row["validation_s"] + row["probe_s"]) / row["train_s"], 3
            )
    passes = [{k: v for k, v in r.items() if k not in ("pid", "t")} for r in records if "pass" in r]
    peak = max([r["peak_rss_mib"] for r in processes] or [0.0])
    worst_epoch = max((row.get("validation_and_probe_over_training", 0.0) for row in epochs.values()), default=None)
    features = (
        json.loads((root / "data" / "features" / "manifest.json").read_text())
        if (root / "data" / "features" / "manifest.json").exists()
        else {}
    )
    ingest = (
        json.loads((root / "data" / "raw" / "ingest_report.json").read_text())
        if (root / "data" / "raw" / "ingest_report.json").exists()
        else {}
    )
    return {
        "data": {
            "ingest": ingest.get("rows", ingest),
            "features_rows": features.get("rows"),
            "n_items": features.get("n_items"),
        },
        "total_minutes": round(repro["total_s"] / 60, 2),
        "peak_rss_gib": round(peak / 1024, 2),
        "stages": stages,
        "epochs": sorted(epochs.values(), key=lambda row: row["epoch"]),
        "ranking_passes": passes,
        "meets_targets": {
            "total_minutes": repro["total_s"] / 60 <= TARGETS["total_minutes"],
            "peak_rss_gib": peak / 1024 <= TARGETS["peak_rss_gib"],
            "validation_and_probe_over_training": None
            if worst_epoch is None
            else worst_epoch <= TARGETS["validation_and_probe_over_training"],
        },  # fmt: skip
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outfits", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--model", default="global_state_attrs", help="any model name (train.models)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="train.num_threads (params.yaml's 1: on a machine "
        "with other work, 2 threads ran the small run's epochs 2-3x slower)",
    )
    parser.add_argument("--set", action="append", default=[], help="key.path=value (YAML) in the project's params")
    parser.add_argument("--root", type=Path, help="the project folder (default /tmp/whole_run/<model>_<outfits>)")
    parser.add_argument("--data", type=Path, help="the generated H&M files (default /tmp/whole_run/hm_<outfits>)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fresh", action="store_true", help="delete the project's outputs first")
    parser.add_argument("--note", default="")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    root = args.root or Path("/tmp/whole_run") / f"{args.model}_{args.outfits}"
    data = args.data or Path("/tmp/whole_run") / f"hm_{args.outfits}"
    if args.fresh and root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    print(f"generating the H&M files in {data} ...", flush=True)
    generated = generate(data, args.outfits, args.seed)
    params = project_params(data, root, args)
    write_project(root, params)
    log = root / "instrument.jsonl"
    log.unlink(missing_ok=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    repro = run_repro(root, log)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    result = {
        "benchmark": "the whole run: one `dvc repro report` on a generated H&M-format set (issue 58, item 2)",
        "full_size": args.outfits >= 100_000 and args.epochs >= 8,
        "settings": {
            "outfits_asked": args.outfits,
            "epochs": args.epochs,
            "model": args.model,
            "threads": args.threads,
            "set": args.set,
            "split": "time",
            "history": True,
            "articles": hm.N_ARTICLES,
            "project": str(root),
        },
        "generated": generated,
        **summarise(records, repro, root),
        "dvc_stage_starts": repro["stages"],
        "targets": TARGETS,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_before": load_before,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "note": args.note,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("total_minutes", "peak_rss_gib", "meets_targets")}, indent=2))


if __name__ == "__main__":
    main()
