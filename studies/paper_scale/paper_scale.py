"""Table 1 at the paper's size (issue 89): 380,000 outfits, 30,000 articles, 100,000 customers
(`generate.size: paper`), every conditioning, with the recipe declared for that size in `settings.yaml`.

A project of its own under --work (studies/project.py) runs the pipeline's data stages through the CLI
(ingest, validate, features, baseline; skipped when their outputs are there). Then each declared (model, seed),
in the declared order, trains in a child process of its own that calls the library (`training.train`: it resumes
from the run's last.pt, written every `train.checkpoint_every_s` within an epoch too, so a killed run goes on
where it stopped) and evaluates it (`evaluate_run`), printing each epoch's validation cross-entropy, seconds and
the run's and the queue's ETA. A run whose entry is in the results file is skipped. After each run the report
stage writes the project's Table 1 over the runs done so far; results.json gets `runs/<model>-s<seed>` (with the
run's time per epoch and peak memory), `table1` and `data`.

    python studies/paper_scale/paper_scale.py --work /tmp/paper_scale            # the last plan's queue (make paper-table1)
    python studies/paper_scale/paper_scale.py --work /tmp/paper_scale --jobs 2   # two runs at a time
    python studies/paper_scale/paper_scale.py --work /tmp/paper_scale --runs none-s0,global_state_update-s0
    python studies/paper_scale/paper_scale.py --work /tmp/paper_scale --measure 240 --runs none-s0

--plan NAME: one of settings.yaml's `plans` (default: its `table1`, the plan of Table 1); its entries are keyed
`<plan>/...` in results.json, the data stages' and the measured prefixes' shared. Each plan needs a --work of its
own (a run resumes from the last.pt in its folder). --jobs N: N runs at a time, each a child process of one thread;
their records and the report stage one at a time.
--measure S: each named run trains for S seconds, then stops; its last.pt says how many steps it made, and the
epoch's projected seconds go to `measure/<model>-s<seed>` (the run goes on from there when it is run).
On a GPU: the same script on a CUDA machine (train.device: auto), or the Prefect gpu pool (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import Project, override, record, relocated  # noqa: E402

HERE = Path(__file__).resolve().parent
SETTINGS = HERE / "settings.yaml"
DATA_STAGES = ("ingest", "validate", "features", "baseline", "optimum")  # optimum: "not known" here


def study_params(settings: dict, root: Path, extra: list[str], features: Path | None) -> dict:
    """params.yaml with the declared overrides (then `extra`, a trial's), under `root`; every model on the
    declared horizon."""
    from contextual_bert.names import MODELS

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for assignment in settings["set"] + extra:
        override(params, assignment)
    for model in dict.fromkeys(parse_run(name)[0] for name in settings["runs"] if parse_run(name)[0] in MODELS):
        params["per_model"][model] = settings["per_model"][model] | {"max_epochs": params["train"]["max_epochs"]}
    params = relocated(params, root)
    if features:  # a trial on the study's data
        params["paths"]["features_dir"] = str(features)
    return params


def plan_settings(settings: dict, plan: str) -> dict:
    """The settings of one plan: its `set` and `runs`, with the models' settings every plan shares."""
    if plan not in settings["plans"]:
        raise SystemExit(f"--plan {plan!r}: settings.yaml declares {', '.join(settings['plans'])}")
    return (
        {k: v for k, v in settings.items() if k not in ("plans", "table1")} | settings["plans"][plan] | {"plan": plan}
    )


def plan_view(results: dict, plan: str, plans: list[str]) -> dict:
    """The results one plan reads: the shared entries (data, measured prefixes) and its own, unprefixed."""
    shared = {k: v for k, v in results.items() if k.split("/", 1)[0] not in plans}
    return shared | {k.removeprefix(f"{plan}/"): v for k, v in results.items() if k.startswith(f"{plan}/")}


def run_name(model: str, seed: int) -> str:
    return f"{model}-s{seed}"


def parse_run(name: str) -> tuple[str, int]:
    model, seed = name.rsplit("-s", 1)
    return model, int(seed)


# --- one run, in a child process -----------------------------------------------------------------------------


def one(params_path: Path, model: str, seed: int, queue_after_s: float) -> dict:
    """Train (resuming) and evaluate one run; print its progress; its entry (with peak memory)."""
    from contextual_bert import cpu_kernels
    from contextual_bert.config import load_config

    cfg = load_config(params_path)
    cpu_kernels.pin(cfg.train_for(model).cpu_kernels)  # before torch is imported
    from contextual_bert.evaluation import evaluate_run
    from contextual_bert.training import train

    train_cfg = cfg.train_for(model)
    horizon = train_cfg.max_epochs
    run_dir = cfg.run_dir(model, seed)
    started = time.perf_counter()

    def progress(epoch: int, row: dict) -> None:
        left = (horizon - epoch) * row["seconds"]
        print(f"[{model} s{seed}] epoch {epoch}/{horizon}: val CE {row['val_cross_entropy']:.4f}, "
              f"{row['seconds']:.0f} s ({row['samples_per_s']:.0f} outfits/s); ETA this run {left / 60:.0f} min, "
              f"the queue {(left + queue_after_s) / 60:.0f} min", flush=True)  # fmt: skip

    metrics = train(cfg.paths.features_dir, run_dir, model, seed, cfg.model_for(model), train_cfg, progress)
    trained_s = time.perf_counter() - started
    report = evaluate_run(cfg.paths.features_dir, run_dir, cfg.eval_path(run_name(model, seed)), cfg.evaluate)
    curve = json.loads((run_dir / "curve.json").read_text())
    test = report["test"]
    return {
        "model": model,
        "seed": seed,
        "learning_rate": train_cfg.learning_rate,
        "batch_size": train_cfg.batch_size,
        "best_val_cross_entropy": metrics["best_val_cross_entropy"],
        "epochs": metrics["epochs"],
        "best_epoch": metrics["best_epoch"],
        "converged": metrics["converged"],
        "parameters": metrics["parameters"],
        **{f"test_{k}": test.get(k) for k in ("cross_entropy", "recall@1", "recall@5", "recall@10")},
        **{f"test_{k}": test.get(k) for k in ("fitb_easy", "fitb_hard")},
        "outfit_dependence": test.get("outfit_dependence"),
        "epoch_seconds": [round(row["seconds"], 1) for row in curve],
        "samples_per_s": [round(row["samples_per_s"], 1) for row in curve],
        "train_seconds": round(metrics["seconds"], 1),
        "evaluate_seconds": round(time.perf_counter() - started - trained_s, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "threads": metrics["threads"],
        "device": metrics["device"],
    }


def measure(params_path: Path, model: str, seed: int, seconds: float) -> dict:
    """Train one run for `seconds`, stop it, and project an epoch's seconds from its last.pt."""
    import torch

    from contextual_bert.config import load_config
    from contextual_bert.data import load_split

    cfg = load_config(params_path)
    run_dir = cfg.run_dir(model, seed)
    command = [sys.executable, __file__, "--one", run_name(model, seed), "--params", str(params_path)]
    child = subprocess.Popen(command)
    time.sleep(seconds)
    child.send_signal(signal.SIGKILL)  # as a killed run: last.pt is its resume state
    child.wait()
    saved = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=True)
    position = saved["position"]
    train_cfg = cfg.train_for(model)
    n_train = len(load_split(cfg.paths.features_dir, "train", cfg.model.max_set_size))
    steps_per_epoch = -(-n_train // train_cfg.batch_size)
    if position is None:  # an epoch ended: its row has its seconds
        epoch_s = saved["state"]["curve"][-1]["seconds"]
        return {"epoch_seconds": round(epoch_s, 1), "steps_per_epoch": steps_per_epoch,
                "batch_size": train_cfg.batch_size, "measured": "an epoch"}  # fmt: skip
    return {
        "steps": int(position["step"]),
        "seconds": round(float(position["seconds"]), 1),
        "steps_per_epoch": steps_per_epoch,
        "epoch_seconds": round(steps_per_epoch * float(position["seconds"]) / int(position["step"]), 1),
        "batch_size": train_cfg.batch_size,
        "peak_rss_mib_child": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
        "measured": f"{int(position['step'])} steps of the first epoch",
    }


# --- the queue -------------------------------------------------------------------------------------------------


def prepare(work: Path, settings: dict, out: Path, extra: list[str], features: Path | None) -> Project:
    project = Project(work, study_params(settings, work, extra, features))
    if features is None and not (project.path("reports_dir") / "eval" / "optimum_context.json").exists():
        for stage in DATA_STAGES:
            started = time.perf_counter()
            project.stage(stage)
            print(f"data: {stage} {time.perf_counter() - started:.0f} s", flush=True)
        record(out, "data", {"seconds": project.timings, "set": settings["set"]})
    return project


def estimate_s(settings: dict, results: dict, model: str) -> float:
    """A run's seconds: its measured epoch x the horizon, or the declared estimate."""
    horizon = next(int(s.split("=")[1]) for s in settings["set"] if s.startswith("train.max_epochs="))
    batch = next(s.split("=")[1] for s in settings["set"] if s.startswith("train.batch_size="))
    measured = [
        v["epoch_seconds"]
        for k, v in results.items()
        if k.startswith(f"measure/{model}-") and k.endswith(f"/batch{batch}")
    ]
    return horizon * (measured[0] if measured else settings["estimate_epoch_seconds"])


PAIRS = [("global_state_update", "concat"), ("global_state", "concat"), ("new_position", "concat"),
         ("global_state_two_way", "concat"), ("adaptive_norm", "concat"), ("global_state_update", "global_state"),
         ("adaptive_norm", "global_state_update"), ("global_state_two_way", "global_state_update"),
         ("concat", "none"), ("concat", "bag_of_items")]  # fmt: skip


def comparisons(evals: Path, done: list[str]) -> dict:
    """The paper's comparisons among the rows done, on test cross-entropy, each pair over the seeds both have (a
    seed draws the data order and the masks for every model alike, so a row's extra seed would shift its mean
    alone): improvement of the first (positive: better) by the seed SE where they share two or more seeds, else
    the paired bootstrap on the same test outfits of their one shared seed."""
    from contextual_bert.evaluation import OUTFITS_KEY, compare, mean_record, mean_se

    def row(model: str, seeds: list[int]) -> tuple:
        mine = [json.loads((evals / f"{run_name(model, seed)}.json").read_text()) for seed in seeds]
        return mean_se([e["test"]["cross_entropy"] for e in mine]), mean_record([e.get(OUTFITS_KEY) for e in mine])

    seeds = {}
    for name in done:
        model, seed = parse_run(name)
        seeds.setdefault(model, []).append(seed)
    out = {}
    for a, b in PAIRS:
        shared = sorted(set(seeds.get(a, [])) & set(seeds.get(b, [])))
        if shared:
            (ours, our_outfits), (theirs, their_outfits) = row(a, shared), row(b, shared)
            out[f"{a} vs {b}"] = compare(ours, theirs, False, "cross_entropy", (our_outfits, their_outfits))
            out[f"{a} vs {b}"]["seeds"] = shared
    return out


def report(project: Project, settings: dict, done: list[str], out: Path) -> None:
    """The report stage over the runs done (each model with the seeds it has), its Table 1 recorded."""
    models = list(dict.fromkeys(parse_run(r)[0] for r in done))
    seeds = sorted({parse_run(r)[1] for r in done})
    if any(run_name(m, s) not in done for m in models for s in seeds):  # the report reads every model x seed
        seeds = [s for s in seeds if all(run_name(m, s) in done for m in models)]
    params = json.loads(json.dumps(project.params))
    params["train"] |= {"models": models, "seeds": seeds}
    project.write_params(params)
    project.stage("report")
    reports = project.path("reports_dir")
    plan = settings["plan"]
    record(out, f"{plan}/table1", (reports / "table1.md").read_text().splitlines())
    record(out, f"{plan}/metrics", json.loads((reports / "metrics.json").read_text()))
    record(out, f"{plan}/comparisons", comparisons(reports / "eval", done))


def benchmark(results: dict, path: Path) -> None:
    """reports/benchmarks/<path>: the paper size's time per epoch and peak memory, per measured prefix and per
    run, with the machine's load (a shared CPU slows every number)."""
    import os
    import platform

    runs = {k.removeprefix("runs/"): v for k, v in results.items() if k.startswith("runs/")}
    out = {
        "benchmark": "Table 1 at the paper's size: time per epoch and peak memory (studies/paper_scale)",
        "commits": sorted({r.get("commit", results["settings"]["commit"]) for r in runs.values()}),
        "plan": results["settings"]["settings"]["plan"],
        "data": results.get("data"),
        "settings": results["settings"]["settings"]["set"],
        "cpu": next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.machine(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.machine(),
        "cores": os.cpu_count(),
        "load_average_now": os.getloadavg(),
        "measured_prefixes": {k.removeprefix("measure/"): v for k, v in results.items() if k.startswith("measure/")},
        "runs": {
            name: {
                k: r[k]
                for k in (
                    "epoch_seconds",
                    "samples_per_s",
                    "train_seconds",
                    "evaluate_seconds",
                    "peak_rss_mib",
                    "threads",
                    "device",
                    "batch_size",
                )
            }  # fmt: skip
            | {"commit": r.get("commit", results["settings"]["commit"])}
            for name, r in runs.items()
        },
    }
    path.write_text(json.dumps(out, indent=1) + "\n")


def seed_table(results: dict) -> list[str]:
    """Each model's test cross-entropy and recall@1 per seed run, with the mean ± SE over them (Table 1 above
    holds only the seeds every model has)."""
    from contextual_bert.evaluation import mean_se

    by_model: dict[str, dict[int, dict]] = {}
    for key, run in results.items():
        if key.startswith("runs/"):
            by_model.setdefault(run["model"], {})[run["seed"]] = run
    seeds = sorted({seed for runs in by_model.values() for seed in runs})

    def cell(stat: dict, scale: float, digits: int) -> str:
        se = f" ± {stat['se'] * scale:.{digits}f}" if stat["se"] is not None else ""
        return f"{stat['mean'] * scale:.{digits}f}{se}"

    lines = [
        "| model | "
        + " | ".join(f"test CE, seed {s}" for s in seeds)
        + " | test CE, mean ± SE | recall@1 %, mean ± SE |",
        "| --- |" + " --- |" * (len(seeds) + 2),
    ]
    for model, runs in sorted(
        by_model.items(), key=lambda m: mean_se(r["test_cross_entropy"] for r in m[1].values())["mean"]
    ):
        ce = mean_se(r["test_cross_entropy"] for r in runs.values())
        r1 = mean_se(r["test_recall@1"] for r in runs.values())
        per_seed = " | ".join(f"{runs[s]['test_cross_entropy']:.3f}" if s in runs else "–" for s in seeds)
        lines.append(f"| {model} | {per_seed} | {cell(ce, 1, 3)} | {cell(r1, 100, 2)} |")
    return lines


def seed_differences(results: dict, pair: str, seeds: list[int]) -> list[float]:
    """A comparison's improvement seed by seed (positive: the first is better): a seed draws the data order and the
    masks for every model alike, so what a draw does to both rows cancels in their difference at that seed."""
    a, b = pair.split(" vs ")
    ce = {k.removeprefix("runs/"): r["test_cross_entropy"] for k, r in results.items() if k.startswith("runs/")}
    return [ce[run_name(b, s)] - ce[run_name(a, s)] for s in seeds]


def render(results: dict) -> str:
    """Markdown for the findings: the report stage's Table 1 rows and its verdicts, each run's time per epoch,
    evaluation time and peak memory, each model's seeds, and the comparisons (also paired by seed)."""
    from contextual_bert.evaluation import mean_se

    table1 = results.get("table1", [])
    keep = [line for line in table1 if line.startswith("|")]
    verdicts = [line for line in table1 if line.startswith(("- **", "  - ", "- Every", "- No ", "- Not"))]
    lines = [
        *keep,
        "",
        *verdicts,
        "",
        "| run | epoch s | outfits/s | evaluation s | peak MiB |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, run in results.items():
        if key.startswith("runs/"):
            lines.append(f"| {key.removeprefix('runs/')} | {', '.join(f'{x:.0f}' for x in run['epoch_seconds'])} | "
                         f"{', '.join(f'{x:.0f}' for x in run['samples_per_s'])} | {run['evaluate_seconds']:.0f} | "
                         f"{run['peak_rss_mib']:,.0f} |")  # fmt: skip
    lines += ["", *seed_table(results)]
    lines += [
        "",
        "| comparison (test CE) | improvement [95% paired bootstrap] or ± SE | per shared seed | paired by seed, mean ± SE |",
        "| --- | --- | --- | --- |",
    ]
    for name, c in results.get("comparisons", {}).items():
        interval = (
            f" [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]" if c.get("ci") else (f" ± {c['se']:.3f}" if c["se"] else "")
        )
        diffs = seed_differences(results, name, c["seeds"])
        paired = mean_se(diffs)
        lines.append(
            f"| {name} | {c['improvement']:+.3f}{interval}"
            + (" **beats**" if c["beats_by_more_than_se"] else "")
            + f" | {', '.join(f'{d:+.3f}' for d in diffs)} | "
            + (f"{paired['mean']:+.3f} ± {paired['se']:.3f} |" if paired["se"] is not None else "– |")
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, help="the project's folder (data, models, reports)")
    parser.add_argument("--settings", type=Path, default=SETTINGS)
    parser.add_argument("--out", type=Path, default=HERE / "results.json", help="the results file")
    parser.add_argument("--plan", help="one of settings.yaml's plans (default: its table1)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (each one thread)")
    parser.add_argument("--runs", help="comma-separated <model>-s<seed> (default: the declared `runs`, in order)")
    parser.add_argument("--measure", type=float, metavar="S", help="train each run S seconds, project its epoch")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a trial's override")
    parser.add_argument("--features", type=Path, help="a trial: read this features folder (the study's data)")
    parser.add_argument("--report", action="store_true", help="the report stage and comparisons over the runs done")
    parser.add_argument("--render", action="store_true", help="print the findings' tables from --out and stop")
    parser.add_argument("--benchmark", type=Path, help="write the time and memory of --out's runs to this file")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one run
    parser.add_argument("--params", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--queue-after", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one:
        model, seed = parse_run(args.one)
        entry = one(args.params, model, seed, args.queue_after)
        (args.params.parent / "runs" / f"{args.one}.json").write_text(json.dumps(entry, indent=1))
        return 0
    declared = yaml.safe_load(args.settings.read_text())
    plan = args.plan or declared["table1"]
    settings = plan_settings(declared, plan)

    def view() -> dict:
        return plan_view(json.loads(args.out.read_text()), plan, list(declared["plans"]))

    if args.render:
        print(render(view()))
        return 0
    if args.benchmark:
        benchmark(view(), args.benchmark)
        return 0
    if args.work is None:
        parser.error("--work is required")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    project = prepare(args.work, settings, args.out, args.set, args.features)
    from contextual_bert.names import MODELS

    names = args.runs.split(",") if args.runs else list(settings["runs"])
    unknown = [n for n in names if parse_run(n)[0] not in MODELS]
    if unknown:
        print(f"not in this library, skipped: {', '.join(unknown)}", flush=True)
        names = [n for n in names if n not in unknown]
    (project.root / "runs").mkdir(exist_ok=True)
    if args.measure:
        for name in names:
            entry = measure(project.params_path, *parse_run(name), args.measure)
            record(args.out, f"measure/{name}/batch{entry['batch_size']}", entry)
            print(f"measure {name}: {entry}", flush=True)
        return 0
    results = view()
    if args.report:
        report(project, settings, [k.removeprefix("runs/") for k in results if k.startswith("runs/")], args.out)
        return 0
    # the commit of this invocation; each run records its own (a queue resumed on newer code runs the rest there)
    record(args.out, f"{plan}/settings", {"commit": commit.strip(), "settings": settings})
    todo = [n for n in names if f"runs/{n}" not in results]
    print(f"{plan}: {len(names) - len(todo)} of {len(names)} runs done; to run: {', '.join(todo) or 'none'}",
          flush=True)  # fmt: skip
    one_at_a_time = threading.Lock()  # the results file and the report stage

    def run(i: int, name: str) -> None:
        after = sum(estimate_s(settings, results, parse_run(n)[0]) for n in todo[i + 1 :]) / args.jobs
        command = [sys.executable, __file__, "--one", name, "--params", str(project.params_path),
                   "--queue-after", str(after)]  # fmt: skip
        print(f"{name}: run {i + 1} of {len(todo)}; the queue after it: about {after / 60:.0f} min", flush=True)
        if subprocess.run(command).returncode != 0:
            raise SystemExit(f"{name} failed")
        entry = json.loads((project.root / "runs" / f"{name}.json").read_text()) | {"commit": commit.strip()}
        with one_at_a_time:
            record(args.out, f"{plan}/runs/{name}", entry)
            print(f"{name}: test CE {entry['test_cross_entropy']:.4f}, {entry['epochs']} epochs "
                  f"({entry['converged'] or 'not converged'}), peak {entry['peak_rss_mib']:.0f} MiB", flush=True)  # fmt: skip
            done = [k.removeprefix("runs/") for k in view() if k.startswith("runs/")]
            try:
                report(project, settings, done, args.out)
            except SystemExit as failed:  # the run is recorded; its Table 1 waits for the next run's report
                print(f"the report stage failed, the queue goes on: {failed}", flush=True)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for future in [pool.submit(run, i, name) for i, name in enumerate(todo)]:
            future.result()  # a failed run ends the queue with its error once the runs under way are done
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
