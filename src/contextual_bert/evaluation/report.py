"""The report stage: the paper's Table 1 for this data, reports/metrics.json and plots.

Reads reports/eval/<model>-s<seed>.json for every model x seed in params (train.models, train.seeds),
reports/eval/popularity.json, the optimum's results where the data's optimum is known
(reports/eval/optimum_context.json, optimum_no_context.json) and models/<model>-s<seed>/curve.json and
metrics.json. Each number is a mean over seeds with its standard error, SE = sample std / sqrt(n). "Beats
[None] by more than the standard error" means the difference of the means exceeds the standard error of that
difference, sqrt(SE_a^2 + SE_b^2). Where a side has one seed (no SE), "beats" is read from a paired bootstrap
over the test outfits instead (bootstrap.paired_difference): yes when its 95% interval of the difference lies
on the better side of 0. Every model is read against its yardstick (popularity and its variants), the
learned baselines (the bags of items), and, where known, the best possible. The statistics are `report_stats.py`'s, Table 1's markdown
`table1.py`'s; this module reads the results and writes the stage's outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

from contextual_bert.config import CURVE_FILE, VARIANTS, Config
from contextual_bert.errors import ContextualBertError, DataError
from contextual_bert.evaluation.report_stats import (
    VERDICT_METRICS,
    compare_models,
    comparison_numbers,
    convergence_summary,
    summarize_runs,
    yardstick_verdicts,
)
from contextual_bert.evaluation.table1 import LABELS, comparison_text, render_table1

PAPER_ORDER = ("global_state_update", "global_state", "new_position", "concat")  # by recall@1, best first
REQUIRED_METRICS = ("cross_entropy", "recall@1", "recall@5")
# Single-result yardsticks beside the trained models, in table order; the optimum only where it is known.
REFERENCES = (
    "optimum_history",
    "optimum_context",
    "optimum_no_context",
    "popularity",
    "popularity_history",
    "popularity_attribute",
    "popularity_attribute_history",
)
VERDICT_NUMBERS = {"better": 1, "level": 0, "worse": -1}  # metrics.json's yardstick verdicts, as numbers


# --- reading ---------------------------------------------------------------------------------------------


def _read_json(path: Path, what: str):
    if not path.exists():
        raise DataError(f"{what} not found", path=path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"not valid JSON ({exc})", path=path) from None


def read_eval(path: Path) -> dict:
    """One evaluation file, its test metrics checked: the required ones present, recalls fractions."""
    return checked_eval(_read_json(path, "evaluation result (run `contextual-bert evaluate` / `baseline`)"), path)


def checked_eval(result: dict, path: Path) -> dict:
    """`result` (read from `path`) if its test metrics hold the required ones and recalls are fractions."""
    test = result.get("test")
    if not isinstance(test, dict):
        raise DataError("no 'test' metrics", path=path, column="test")
    for metric in REQUIRED_METRICS:
        if not isinstance(test.get(metric), (int, float)):
            raise DataError("metric absent or not a number", path=path, column=f"test.{metric}")
    for metric, value in test.items():
        if metric.startswith("recall@") and value is not None and not 0 <= value <= 1:
            raise DataError(f"recall must be a fraction in [0, 1], got {value}", path=path, column=f"test.{metric}")
    return result


def read_curve(path: Path) -> list[dict]:
    curve = _read_json(path, "training curve (run `contextual-bert train`)")
    if not isinstance(curve, list):
        raise DataError("expected a list of epochs", path=path)
    return curve


def read_references(cfg: Config) -> dict[str, dict]:
    """Popularity, and the optimum's two results when their files exist (data whose optimum is known)."""
    found = {"popularity": read_eval(cfg.eval_path("popularity"))}
    for name in REFERENCES:
        path = cfg.eval_path(name)
        if name == "popularity" or not path.exists():
            continue
        result = _read_json(
            path,
            "the optimum's result (run `contextual-bert optimum`)"
            if name.startswith("optimum")
            else f"the {LABELS[name].lower()} yardstick (run `contextual-bert baseline`)",
        )
        if result.get("known") is not False:  # false: the stage ran, and this data has none
            found[name] = checked_eval(result, path)
    return {name: found[name] for name in REFERENCES if name in found}


# --- the stage -------------------------------------------------------------------------------------------


def against_learned_baselines(summary: dict, context_variants: list[str]) -> dict | None:
    """[None] against the bag of items, and the best context variant (by cross-entropy) against the bag of
    items with c: a transformer that does not beat them has not earned its parameters."""
    pairs = []
    if "none" in summary and "bag_of_items" in summary:
        pairs.append(("none", "bag_of_items"))
    if context_variants and "bag_of_items_context" in summary:
        best = min(context_variants, key=lambda v: summary[v]["test"]["cross_entropy"]["mean"])
        pairs.append((best, "bag_of_items_context"))
    if not pairs:
        return None
    checks, lines = {}, []
    for model, baseline in pairs:
        per_metric = {m: compare_models(summary[model], summary[baseline], m, higher) for m, higher in VERDICT_METRICS}
        checks[f"{model}_vs_{baseline}"] = {m: comparison_numbers(c) for m, c in per_metric.items()}
        lines.append(f"{LABELS.get(model, model)} against {LABELS[baseline]}: {comparison_text(per_metric)}")
    return {"checks": checks, "lines": lines}


def _metrics_json(summary: dict, references: dict, verdicts: dict) -> dict:
    """Nested dicts of numbers only, for `dvc metrics show`."""
    out = {
        name: {"test": {k: v for k, v in result["test"].items() if isinstance(v, (int, float))}}
        for name, result in references.items()
    }
    for model, s in summary.items():
        # Counts (n_outfits, n_cases, ...) are the same for every seed: one number, no SE.
        entry = {
            "test": {
                m: stat["mean"]
                if m.startswith("n_")
                else {k: v for k, v in stat.items() if k in ("mean", "se") and v is not None}
                for m, stat in s["test"].items()
            },
            "parameters": s["parameters"],
            "n_seeds": s["n_seeds"],
        }
        if s.get("recall@1_gain_vs_none") is not None:
            entry["recall@1_gain_vs_none"] = s["recall@1_gain_vs_none"]
        if s.get("convergence"):
            entry["converged_runs"] = s["convergence"]["converged"]
        for metric, c in verdicts.get("per_variant", {}).get(model, {}).items():
            entry.setdefault("vs_none", {})[metric] = comparison_numbers(c)
        out[model] = entry
    return out


def _verdicts_and_order(summary: dict, context_variants: list[str]) -> tuple[dict, dict]:
    """(the context variants against [None], their order by recall@1 against the paper's); each context variant's
    summary gains its recall@1 gain over [None]."""
    verdicts, order = {}, {}
    if "none" in summary:
        none = summary["none"]["test"]
        for v in context_variants:
            baseline_r1 = none["recall@1"]["mean"]
            summary[v]["recall@1_gain_vs_none"] = (
                summary[v]["test"]["recall@1"]["mean"] / baseline_r1 - 1 if baseline_r1 else None
            )
        if context_variants:
            per_variant = {
                v: {m: compare_models(summary[v], summary["none"], m, higher) for m, higher in VERDICT_METRICS}
                for v in context_variants
            }
            flags = [c["beats_by_more_than_se"] for pv in per_variant.values() for c in pv.values()]
            overall = False if False in flags else (None if None in flags else True)
            verdicts = {"all_beat_none_by_more_than_se": overall, "per_variant": per_variant}
    if len(context_variants) > 1:
        ours = sorted(context_variants, key=lambda v: -summary[v]["test"]["recall@1"]["mean"])
        paper = [v for v in PAPER_ORDER if v in context_variants]
        within = [
            (a, b)
            for a, b in zip(ours, ours[1:])
            if compare_models(summary[a], summary[b], "recall@1", True)["beats_by_more_than_se"] is False
        ]
        # a variant of ours (OWN_VARIANTS) has no place in the paper's order: it is ranked, not matched
        matches = [v for v in ours if v in PAPER_ORDER] == paper
        order = {"ours": ours, "paper": paper, "matches_paper": matches, "within_se": within}
    return verdicts, order


def build_report(cfg: Config) -> dict:
    """Write reports/table1.md, reports/metrics.json and reports/plots/; return a summary."""
    models, seeds = list(cfg.train.models), list(cfg.train.seeds)
    if not models or not seeds:
        raise ContextualBertError("params.yaml: train.models and train.seeds must not be empty")
    results = {
        v: [_read_json(cfg.eval_path(f"{v}-s{s}"), "evaluation result (run `contextual-bert evaluate`)") for s in seeds]
        for v in models
    }
    # a model this data cannot train (e.g. one that reads the context, on outfits without customers): said, not a row
    unavailable = {v: runs[0].get("why") for v, runs in results.items() if all(r.get("known") is False for r in runs)}
    models = [v for v in models if v not in unavailable]
    if not models:
        raise ContextualBertError(f"no model of train.models could be trained on this data: {unavailable}")
    evals = {v: [checked_eval(r, cfg.eval_path(f"{v}-s{s}")) for r, s in zip(results[v], seeds)] for v in models}
    references = read_references(cfg)
    popularity = references["popularity"]
    curves = {v: {s: read_curve(cfg.run_dir(v, s) / CURVE_FILE) for s in seeds} for v in models}

    summary = {v: summarize_runs(runs) for v, runs in evals.items()}
    for v in models:
        paths = [cfg.run_dir(v, s) / "metrics.json" for s in seeds]
        if all(p.exists() for p in paths):
            summary[v]["convergence"] = convergence_summary([_read_json(p, "training metrics") for p in paths])
    context_variants = [v for v in models if v in VARIANTS and v != "none"]
    verdicts, order = _verdicts_and_order(summary, context_variants)

    baseline_verdicts = against_learned_baselines(summary, context_variants)
    yardsticks = yardstick_verdicts(evals, summary, references)

    reports_dir = cfg.paths.reports_dir
    reports_dir.mkdir(parents=True, exist_ok=True)
    (reports_dir / "table1.md").write_text(
        render_table1(cfg, summary, references, verdicts, order, baseline_verdicts, yardsticks, unavailable)
    )
    metrics = _metrics_json(summary, references, verdicts)
    for v, c in yardsticks.items():
        if c.get("verdict") is not None:
            metrics[v]["vs_yardstick"] = {"difference": c["difference"], "verdict": VERDICT_NUMBERS[c["verdict"]]}
    if baseline_verdicts:
        metrics["vs_learned_baselines"] = baseline_verdicts["checks"]
    if unavailable:
        metrics["not_trained"] = {v: 1 for v in unavailable}  # numbers only: why is in table1.md
    (reports_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    from contextual_bert.evaluation.plots import write_plots

    plots = write_plots(reports_dir / "plots", evals, popularity, curves, LABELS)
    return {
        "table": str(reports_dir / "table1.md"),
        "metrics": str(reports_dir / "metrics.json"),
        "plots": [str(p) for p in plots],
        "summary": {
            v: {m: s["test"][m] for m in REQUIRED_METRICS} | {"parameters": s["parameters"]} for v, s in summary.items()
        },
        "all_beat_none_by_more_than_se": verdicts.get("all_beat_none_by_more_than_se"),
        "vs_learned_baselines": (baseline_verdicts or {}).get("checks"),
        "vs_yardstick": {v: {"name": c["name"], "verdict": c.get("verdict")} for v, c in yardsticks.items()},
        "order_by_recall@1": order.get("ours"),
        "order_matches_paper": order.get("matches_paper"),
    }
