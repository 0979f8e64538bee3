"""Does history help? The same models with and without the customer's history, on the time split.

Two projects of their own under --workdir (studies/project.py), on the same data and the same time split
(features.split: time): one with features.history on, its whole Table 1 (train.models x train.seeds, the
yardsticks: popularity, popularity + own history, the bag of items + c with history, and where the data's
optimum is known its three rows); one with history off, for the --compare models only. Each compared model
with history is paired with itself without, on the same test outfits: the paired bootstrap of the
difference of their seed means (bootstrap.paired_difference). Recorded in the results file (--out, default the
study's results.json) under --run: <run>/table1 (one string a line) and <run>/metrics (history on),
<run>/comparison; its table printed.

    python studies/history/history.py --run default --workdir /tmp/history-default
    python studies/history/history.py --set ingest.source=planted --set planted.customer_taste_strength=4 \\
        --set planted.n_outfits=24000 --set planted.n_customers=6000 --run planted_4 --workdir /tmp/history-planted-4
    python studies/history/history.py --pair /tmp/history-planted-8-attrs-attention /tmp/history-planted-8-attrs \\
        --compare global_state_attrs --seeds 0 --run readers/pairs/planted_8_attention
    python studies/history/history.py --curve planted_2_attrs planted_4_attrs_seed0 planted_8_attrs \\
        --compare global_state_attrs --run planted_curve_attrs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from contextual_bert.evaluation import LABELS, OUTFITS_KEY, mean_record, paired_difference  # noqa: E402
from studies.project import Project, override, record, relocated  # noqa: E402

METRICS = (("cross_entropy", False), ("recall@5", True))


def run_project(
    root: Path, params: dict, runs: list[tuple[str, int]], jobs: int, threads: int, reuse: bool = False
) -> Project:
    project = Project(root, relocated(params, root), threads)
    if reuse:
        project.check_reusable()  # before the stages rebuild its data
    for stage in ("ingest", "validate", "features", "baseline", "optimum"):
        project.stage(stage)
    project.train_and_evaluate(runs, jobs, reuse)
    project.stage("report")
    return project


def eval_of(project: Project, name: str) -> dict:
    return json.loads((project.path("reports_dir") / "eval" / f"{name}.json").read_text())


def paired(a: Project, b: Project, model: str, seeds: list[int], names=("with_history", "without")) -> dict:
    """Per metric: the seed means of `model` in projects a and b (under `names`), a's improvement over b and
    the paired bootstrap's interval of it (positive: a better)."""
    runs = [[eval_of(p, f"{model}-s{s}") for s in seeds] for p in (a, b)]
    out = {}
    for metric, higher in METRICS:
        means = [sum(e["test"][metric] for e in r) / len(r) for r in runs]
        difference = paired_difference(*(mean_record([e[OUTFITS_KEY] for e in r]) for r in runs), metric)
        sign = 1.0 if higher else -1.0
        interval = None if difference["interval"] is None else sorted(sign * x for x in difference["interval"])
        out[metric] = {
            names[0]: means[0],
            names[1]: means[1],
            "improvement": sign * (means[0] - means[1]),
            "ci": interval,
            "beats": None if interval is None else bool(interval[0] > 0),
        }
    return out


def compare(on: Project, off: Project, model: str, seeds: list[int]) -> dict:
    """The model with history against itself without: seed means and the paired bootstrap of their difference
    (positive: history better)."""
    out = paired(on, off, model, seeds)
    out["converged"] = [
        json.loads((on.path("models_dir") / f"{model}-s{s}" / "metrics.json").read_text()).get("converged")
        for s in seeds
    ]
    return out


def pair_settings(candidate: Path, base: Path, out: Path, run: str, model: str, seeds: list[int]) -> None:
    """No training: `model` with history trained by two studies under other settings (their --workdir, e.g.
    model.history_pooling attention against mean), paired on the same test outfits; recorded as `run` in the results file `out`."""

    def project(root: Path) -> Project:
        return Project(root / "history", yaml.safe_load((root / "history" / "params.yaml").read_text()), 1)

    result = {
        "candidate": str(candidate),
        "base": str(base),
        "model": model,
        "seeds": seeds,
        **paired(project(candidate), project(base), model, seeds, names=("candidate", "base")),
    }
    record(out, run, result)
    print(json.dumps(result, indent=2))


def curve(points: list[str], out: Path, run: str, model: str = "global_state") -> None:
    """The gap to the optimum with history over outfits per customer: one <point>/comparison of the results file
    `out` per point (its planted.n_outfits / planted.n_customers read from its settings), recorded there as
    <run>/curve (its table printed). The points
    may hold the outfits fixed (fewer customers) or the customers (more outfits): the table says which."""
    rows = []
    results = json.loads(out.read_text())
    for point in points:
        result = results[f"{point}/comparison"]
        settings = dict(a.split("=", 1) for a in result["set"])
        per_customer = int(settings["planted.n_outfits"]) / int(settings["planted.n_customers"])
        refs, c = result["references_cross_entropy"], result["compared"][model]["cross_entropy"]
        rows.append(
            {
                "outfits_per_customer": per_customer,
                "outfits": int(settings["planted.n_outfits"]),
                "customers": int(settings["planted.n_customers"]),
                "point": point,
                model: c,
                "references": refs,
                "gap_with_history": c["with_history"] - refs["optimum_history"],
                "gap_without_history": c["without"] - refs["optimum_context"],
                "history_in_the_optimum": refs["optimum_context"] - refs["optimum_history"],
                # the gap with history = the gap without it + what of the history's worth the model misses
                "history_missed": refs["optimum_context"] - refs["optimum_history"] - c["improvement"],
            }
        )
    rows.sort(key=lambda r: r["outfits_per_customer"])
    gaps = [r["gap_with_history"] for r in rows]
    summary = {"model": model, "points": rows, "gap_shrinks": all(b < a for a, b in zip(gaps, gaps[1:]))}
    record(out, f"{run}/curve", summary)
    label = LABELS.get(model, model)
    lines = [
        f"# {label} with history on planted data, over outfits per customer",
        "",
        (
            f"| outfits per customer | outfits | customers | {label} + history | without | better by [95% paired CI] | "
            "popularity + own history | optimum with context | with context and history | gap to it (with history) | gap without "
            "history | history's worth missed |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, refs = r[model], r["references"]
        lines.append(
            f"| {r['outfits_per_customer']:g} | {r['outfits']:,} | {r['customers']:,} | "
            f"{c['with_history']:.3f} | {c['without']:.3f} | "
            f"{c['improvement']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}] | "
            f"{refs['popularity_history']:.3f} | {refs['optimum_context']:.3f} | "
            f"{refs['optimum_history']:.3f} | {r['gap_with_history']:+.3f} | {r['gap_without_history']:+.3f} | "
            f"{r['history_missed']:.3f} of {r['history_in_the_optimum']:.3f} |"
        )
    lines += [
        "",
        f"Gap to the optimum with history shrinks as outfits per customer grow: "
        f"**{'yes' if summary['gap_shrinks'] else 'no'}**.",
    ]
    print("\n".join(lines))


def ablation(project_root: Path, models: list[str], out: Path, run: str, lengths=(0, 5, 10, 20, 50)) -> None:
    """How much a trained history model leans on the history: its cross-entropy on (every fifth) training
    outfit and on the test outfits with each history cut to its first k articles (k = 0: none). A model that
    gains on training outfits and loses on test ones has learnt customers by heart."""
    import torch

    from contextual_bert.config import EvaluateConfig
    from contextual_bert.data import HISTORY_FEATURE, PAD_INDEX, load_split
    from contextual_bert.evaluation import evaluate_split
    from contextual_bert.model import load_checkpoint

    torch.set_num_threads(1)
    cfg, result, shares = EvaluateConfig(fitb={"enabled": False}), {}, {}
    for name in models:
        model, _ = load_checkpoint(project_root / "models" / name / "checkpoint.pt")
        result[name] = {}
        for split in ("train", "test"):
            data = load_split(project_root / "data" / "features", split, model.model_cfg.max_set_size)
            if split == "train":
                data = data.subset(torch.arange(0, len(data), 5))
            history = data.context[HISTORY_FEATURE].clone()
            # the share of the outfits' articles already in their customer's history (repeats)
            real = data.items > PAD_INDEX
            repeats = (data.items.unsqueeze(-1) == history.unsqueeze(1)).any(-1) & real
            shares[split] = float(repeats.sum() / real.sum())
            result[name][split] = {}
            for k in lengths:
                data.context[HISTORY_FEATURE] = torch.where(
                    torch.arange(history.shape[1]) < k, history, torch.full_like(history, PAD_INDEX)
                )
                metrics, _ = evaluate_split(model, data, cfg, torch.device("cpu"))
                result[name][split][str(k)] = metrics["cross_entropy"]
    record(
        out,
        run,
        {
            "project": str(project_root),
            "items_in_their_history": shares,
            "history_articles_kept": list(lengths),
            "cross_entropy": result,
        },
    )
    print(json.dumps(result, indent=2))


def kept_timings(before: dict, seconds: dict) -> None:
    """--reuse: the trainings' seconds of the call that trained them, into this call's `seconds`."""
    for project, timings in seconds.items():
        for stage, took in before.get(project, {}).items():
            if stage.startswith("train ") and stage not in timings:
                timings[stage] = took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a params override")
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument(
        "--models",
        nargs="+",
        default=["concat", "new_position", "global_state", "global_state_update", "bag_of_items_context"],
        help="the models trained with history (train.models)",
    )
    parser.add_argument("--compare", nargs="+", default=["global_state"], help="models also trained without history")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="trainings at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per training")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the models an earlier call with the same settings "
        "trained in --workdir (evaluated again); train only the runs it lacks",
    )
    parser.add_argument("--run", required=True, help="the run's key in the results file")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"), help="the results file")
    parser.add_argument("--curve", nargs="+", help="no training: the curve over these runs of the results file")
    parser.add_argument(
        "--pair",
        type=Path,
        nargs=2,
        metavar=("CANDIDATE", "BASE"),
        help="no training: the --compare model with history in two studies' --workdir, paired, as --run",
    )
    parser.add_argument(
        "--ablate",
        type=Path,
        help="no training: ablation() of this trained history project's --compare models, as --run",
    )
    args = parser.parse_args()
    if args.curve:
        curve(args.curve, args.out, args.run, args.compare[0])
        return 0
    if args.pair:
        pair_settings(*args.pair, args.out, args.run, args.compare[0], args.seeds)
        return 0
    if args.ablate:
        ablation(args.ablate, [f"{m}-s{s}" for m in args.compare for s in args.seeds[:1]], args.out, args.run)
        return 0
    if args.workdir is None:
        parser.error("--workdir is required to train")

    base = yaml.safe_load(args.params.read_text())
    for assignment in args.set:
        override(base, assignment)
    base["train"]["num_threads"] = args.threads
    base["features"]["split"] = "time"
    on_params = json.loads(json.dumps(base))
    on_params["features"]["history"]["enabled"] = True
    on_params["train"]["models"], on_params["train"]["seeds"] = args.models, args.seeds
    off_params = json.loads(json.dumps(base))
    off_params["features"]["history"]["enabled"] = False
    off_params["train"]["models"], off_params["train"]["seeds"] = args.compare, args.seeds

    on = run_project(
        args.workdir / "history",
        on_params,
        [(m, s) for m in args.models for s in args.seeds],
        args.jobs,
        args.threads,
        args.reuse,
    )
    off = run_project(
        args.workdir / "no_history",
        off_params,
        [(v, s) for v in args.compare for s in args.seeds],
        args.jobs,
        args.threads,
        args.reuse,
    )

    reports = on.path("reports_dir")
    record(args.out, f"{args.run}/table1", (reports / "table1.md").read_text().splitlines())
    record(args.out, f"{args.run}/metrics", json.loads((reports / "metrics.json").read_text()))
    comparison = {model: compare(on, off, model, args.seeds) for model in args.compare}
    references = {
        name: eval_of(on, name)["test"]["cross_entropy"]
        for name in ("popularity", "popularity_history", "optimum_history", "optimum_context", "optimum_no_context")
        if (on.path("reports_dir") / "eval" / f"{name}.json").exists() and eval_of(on, name).get("known") is not False
    }
    seconds = {"history": on.timings, "no_history": off.timings}
    before = json.loads(args.out.read_text()).get(f"{args.run}/comparison") if args.out.exists() else None
    if args.reuse and before:
        kept_timings(before["seconds"], seconds)
    result = {
        "set": args.set,
        "seeds": args.seeds,
        "compared": comparison,
        "references_cross_entropy": references,
        "seconds": seconds,
    }
    record(args.out, f"{args.run}/comparison", result)
    lines = [
        f"# With and without history ({', '.join(args.set) or 'params.yaml'}; time split; seeds {args.seeds})",
        "",
        "| Model | CE with history | CE without | better by [95% paired CI] | recall@5 % with | without | "
        "better by, pts [95% CI] | converged (with) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, c in comparison.items():
        ce, r5 = c["cross_entropy"], c["recall@5"]
        ci = lambda x, k: (
            "–" if x["ci"] is None else f"{x['improvement'] * k:+.3f} [{x['ci'][0] * k:+.3f}, {x['ci'][1] * k:+.3f}]"
        )  # noqa: E731
        lines.append(
            f"| {LABELS.get(model, model)} | {ce['with_history']:.3f} | {ce['without']:.3f} | {ci(ce, 1)} | "
            f"{100 * r5['with_history']:.2f} | {100 * r5['without']:.2f} | {ci(r5, 100)} | "
            f"{sum(x is not None for x in c['converged'])}/{len(c['converged'])} |"
        )
    lines += [
        "",
        "Yardsticks (test CE, the same cases): "
        + ", ".join(f"{LABELS.get(k, k).lower()} {v:.3f}" for k, v in references.items()),
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
