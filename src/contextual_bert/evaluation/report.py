"""The report stage: the paper's Table 1 for this data, reports/metrics.json and plots.

Reads reports/eval/<variant>-s<seed>.json for every variant x seed in params (train.variants, train.seeds),
reports/eval/popularity.json, the optimum's results where the data's optimum is known
(reports/eval/optimum_context.json, optimum_no_context.json) and models/<variant>-s<seed>/curve.json and
metrics.json. Each number is a mean over seeds with its standard error, SE = sample std / sqrt(n). "Beats
[None] by more than the standard error" means the difference of the means exceeds the standard error of that
difference, sqrt(SE_a^2 + SE_b^2). Where a side has one seed (no SE), "beats" is read from a paired bootstrap
over the test outfits instead (bootstrap.paired_difference): yes when its 95% interval of the difference lies
on the better side of 0. Every model is read against yardsticks: popularity, the learned bag-of-items
baselines, and, where known, the best possible.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from contextual_bert.evaluation.bootstrap import (CI_METRICS, DEPENDENCE_METRIC, KNOWN_OUTFITS_KEY, LEVEL, OUTFITS_KEY,
                                       mean_record, paired_difference, pooled_interval)
from contextual_bert.config import (ATTRIBUTES_SUFFIX, CURVE_FILE, BASELINE_MODELS, VARIANTS, Config, base_model,
                                     uses_attributes)
from contextual_bert.errors import ContextualBertError, DataError
from contextual_bert.data.feature_store import MANIFEST_FILE
from contextual_bert.evaluation.fitb import METRICS as FITB_METRICS
from contextual_bert.evaluation.fitb import RESULT_KEY as FITB_KEY
from contextual_bert.evaluation.ranking import STUCK_BELOW
from contextual_bert.evaluation.yardstick import VERDICT_KEY, summary_verdict, yardstick_of

LABELS = {
    "popularity": "Popularity",
    "optimum_context": "Optimum, with context",
    "optimum_no_context": "Optimum, without context",
    "bag_of_items": "Bag of items",
    "bag_of_items_context": "Bag of items + c",
    "none": "[None]",
    "concat": "[C]",
    "new_position": "[NP]",
    "global_state": "[GS]",
    "global_state_update": "[GSU]",
    "popularity_attribute": "Popularity by attribute",
    "popularity_history": "Popularity + own history",
    "popularity_attribute_history": "Popularity by attribute + own history",
    "optimum_history": "Optimum, with context and history",
}
LABELS |= {f"{m}_attrs": f"{LABELS[m]} + attributes" for m in (*VARIANTS, *BASELINE_MODELS)}
# Denk & Peleteiro Ramallo (2020), Table 1: 17k held-out of 380k outfits, mean of 3 runs.
PAPER_TABLE1 = {
    "none": {"cross_entropy": 5.26, "recall@1": 0.085, "parameters": 546_432},
    "concat": {"cross_entropy": 4.94, "recall@1": 0.103, "parameters": 673_664},
    "new_position": {"cross_entropy": 4.93, "recall@1": 0.105, "parameters": 640_768},
    "global_state": {"cross_entropy": 4.85, "recall@1": 0.112, "parameters": 723_328},
    "global_state_update": {"cross_entropy": 4.75, "recall@1": 0.122, "parameters": 921_856},
}
PAPER_ORDER = ("global_state_update", "global_state", "new_position", "concat")  # by recall@1, best first
REQUIRED_METRICS = ("cross_entropy", "recall@1", "recall@5")
METRIC_LABELS = {"cross_entropy": "cross-entropy", "recall@5": "recall@5"}
# (metric, True when higher is better) for the "beats [None]" verdicts.
VERDICT_METRICS = (("cross_entropy", False), ("recall@5", True))
# Single-result yardsticks beside the trained models, in table order; the optimum only where it is known.
REFERENCES = ("optimum_history", "optimum_context", "optimum_no_context", "popularity", "popularity_history",
              "popularity_attribute", "popularity_attribute_history")
SEED_SE_TARGET = 0.02  # nats: a row's seed SE of the test cross-entropy above it is named, with its seeds' spread
TARGET_PARTS = ("test_known", "test_unseen")  # the catalogue rankers' targets with and without an id
CONVERGENCE_LABELS = {"early_stopping": "early stop", "plateau": "plateau"}
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
            raise DataError(f"recall must be a fraction in [0, 1], got {value}", path=path,
                            column=f"test.{metric}")
    return result


def read_history(path: Path) -> list[dict]:
    history = _read_json(path, "training history (run `contextual-bert train`)")
    if not isinstance(history, list):
        raise DataError("expected a list of epochs", path=path)
    return history


def read_references(cfg: Config) -> dict[str, dict]:
    """Popularity, and the optimum's two results when their files exist (data whose optimum is known)."""
    found = {"popularity": read_eval(cfg.eval_path("popularity"))}
    for name in REFERENCES:
        path = cfg.eval_path(name)
        if name == "popularity" or not path.exists():
            continue
        result = _read_json(path, "the optimum's result (run `contextual-bert optimum`)" if name.startswith("optimum")
                            else f"the {LABELS[name].lower()} yardstick (run `contextual-bert baseline`)")
        if result.get("known") is not False:  # false: the stage ran, and this data has none
            found[name] = checked_eval(result, path)
    return {name: found[name] for name in REFERENCES if name in found}


def convergence_summary(metrics: list[dict]) -> dict:
    """How many of a variant's runs converged (training.convergence), and how."""
    ways = [m.get("converged") for m in metrics]
    return {"converged": sum(w is not None for w in ways), "n": len(ways), "ways": ways,
            "best_epochs": [m.get("best_epoch") for m in metrics], "epochs": [m.get("epochs") for m in metrics]}


# --- statistics ------------------------------------------------------------------------------------------


def mean_se(values) -> dict:
    """{"mean", "se", "n"}; se is None for a single value."""
    values = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if len(values) == 0:
        return {"mean": None, "se": None, "n": 0}
    se = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None
    return {"mean": float(values.mean()), "se": se, "n": int(len(values))}


def compare(variant: dict, baseline: dict, higher_is_better: bool, metric: str | None = None,
            outfits: tuple[dict | None, dict | None] = (None, None)) -> dict:
    """How much `variant` improves on `baseline` (positive = better) and whether it beats it
    ("beats_by_more_than_se"), by one of two yardsticks:

    - "se": both sides have >= 2 seeds; beats when the improvement exceeds the SE of the difference.
    - "paired bootstrap": a side has one seed and `outfits` (the two sides' per-outfit records) pair on the
      same test cases; "ci" is the interval of the improvement and it beats when all of it is above 0.

    Otherwise the verdict is None and "why" says why."""
    improvement = variant["mean"] - baseline["mean"]
    if not higher_is_better:
        improvement = -improvement
    out = {"improvement": improvement, "se": None, "yardstick": None, "beats_by_more_than_se": None}
    if variant["se"] is not None and baseline["se"] is not None:
        se = math.sqrt(variant["se"] ** 2 + baseline["se"] ** 2)
        return out | {"se": se, "yardstick": "se", "beats_by_more_than_se": bool(improvement > se)}
    if metric is None or None in outfits:
        return out | {"why": "n=1, no per-outfit cases"}
    paired = paired_difference(*outfits, metric)
    if paired["interval"] is None:
        return out | {"why": f"n=1, {paired['why']}"}
    sign = 1.0 if higher_is_better else -1.0
    low, high = sorted(sign * bound + 0.0 for bound in paired["interval"])  # + 0.0: no "-0.00" in the text
    return out | {"yardstick": "paired bootstrap", "ci": [low, high], "beats_by_more_than_se": bool(low > 0)}


def compare_models(a: dict, b: dict, metric: str, higher_is_better: bool) -> dict:
    """compare() of two summaries (summarize_runs, or a reference's) on one metric, with their records."""
    return compare(a["test"][metric], b["test"][metric], higher_is_better, metric,
                   (a.get(OUTFITS_KEY), b.get(OUTFITS_KEY)))


def summarize_runs(evals: list[dict]) -> dict:
    """Mean and SE over seeds of every test metric, and the parameter count."""
    metrics = sorted({k for e in evals for k, v in e["test"].items() if isinstance(v, (int, float))})
    return {
        "test": {m: mean_se([e["test"].get(m) for e in evals]) for m in metrics},
        "parameters": int(evals[0].get("parameters") or 0),
        "n_seeds": len(evals),
        "seeds": [e.get("seed") for e in evals],
        "test_by_seed": {m: [e["test"].get(m) for e in evals] for m in ("cross_entropy",)},
        OUTFITS_KEY: mean_record([e.get(OUTFITS_KEY) for e in evals]),
        KNOWN_OUTFITS_KEY: mean_record([e.get(KNOWN_OUTFITS_KEY) for e in evals]),
        "test_bootstrap": {m: pooled_interval([(e.get("test_bootstrap") or {}).get(m) for e in evals])
                           for m in CI_METRICS},
        FITB_KEY: {m: pooled_interval([fitb_interval(e, m) for e in evals]) for m in FITB_METRICS},
        # models that rank the catalogue: targets with an id embedding (known) and without (unseen) apart
        **{part: {"test": {m: mean_se([e[part].get(m) for e in evals]) for m in e0_metrics(evals, part)},
                  "bootstrap": {m: pooled_interval([(e.get(f"{part}_bootstrap") or {}).get(m) for e in evals])
                                for m in CI_METRICS}}
           for part in TARGET_PARTS if all(part in e for e in evals)},
    }


def fitb_interval(result: dict, metric: str) -> list[float] | None:
    """The bootstrap interval of one evaluation's FITB accuracy (fitb.py), None where it has none."""
    return ((result.get(FITB_KEY) or {}).get(metric.removeprefix("fitb_")) or {}).get("ci")


def _fitb_cells(test: dict, result: dict, pooled: bool) -> list[str]:
    """FITB easy and hard accuracy % [95% CI] (a summary's pooled intervals, or one result's)."""
    intervals = {m: (result.get(FITB_KEY) or {}).get(m) if pooled else fitb_interval(result, m) for m in FITB_METRICS}
    return [f"{_fmt(test.get(m), True, 1)} [{_fmt_ci(intervals[m])}]" if test.get(m) is not None else "–"
            for m in FITB_METRICS]


def e0_metrics(evals: list[dict], part: str) -> list[str]:
    return sorted({k for e in evals for k, v in e[part].items() if isinstance(v, (int, float))})


def history_lines(summary: dict, references: dict) -> list[str]:
    """With features.history on: every model that reads c (and so the history) against popularity mixed with
    the customer's own history, paired on the same test cases."""
    if "popularity_history" not in references:
        return []
    ref = references["popularity_history"]
    ref_row = {"test": {k: {"mean": v, "se": None} for k, v in ref["test"].items() if isinstance(v, (int, float))},
               OUTFITS_KEY: ref.get(OUTFITS_KEY)}
    lines = ["", "## Does history help?", "",
             f"- Every context in this table holds the customer's history (features.history). The yardstick: "
             f"{LABELS['popularity_history'].lower()}, CE {ref['test']['cross_entropy']:.3f} (its weight "
             f"{ref.get('weight')}, chosen on validation). Each model that reads c against it:"]
    for v in summary:
        if base_model(v) in ("none", "bag_of_items"):
            continue
        row, on = summary[v], ""
        if uses_attributes(v) and "test_known" in row:
            # it ranks every test target, the yardstick only those with an id: paired on those
            row, on = {"test": row["test_known"]["test"], OUTFITS_KEY: row.get(KNOWN_OUTFITS_KEY)}, " (known targets)"
        per_metric = {m: compare_models(row, ref_row, m, higher) for m, higher in VERDICT_METRICS}
        lines.append(f"  - {LABELS.get(v, v)}{on}: {_comparison_text(per_metric)}")
    return lines


def attribute_lines(summary: dict, references: dict) -> list[str]:
    """The attribute models ("<model>_attrs") on all, known and unseen targets, read against the
    attribute-aware popularity."""
    models = [v for v in summary if uses_attributes(v)]
    if not models:
        return []
    lines = ["", "## Article attributes", "",
             "- The models with attributes and the attribute-aware popularity rank the whole catalogue (the "
             "articles table), so every test target is ranked; the models of ids only rank the train vocabulary "
             "and skip unseen targets (their rows above). Known: the target has an id embedding (seen in "
             "training); unseen: it has none. Cross-entropy (nats) / recall@5 % [95% bootstrap CI]:", ""]
    rows = {name: {"test": {k: {"mean": v, "se": None} for k, v in ref["test"].items() if isinstance(v, (int, float))},
                   "test_bootstrap": ref.get("test_bootstrap") or {}, OUTFITS_KEY: ref.get(OUTFITS_KEY),
                   **{part: {"test": {k: {"mean": v, "se": None} for k, v in ref[part].items()
                                      if isinstance(v, (int, float))},
                             "bootstrap": ref.get(f"{part}_bootstrap") or {}} for part in TARGET_PARTS if part in ref}}
            for name, ref in references.items() if name == "popularity_attribute"}
    rows |= {v: summary[v] for v in models}
    lines += ["| Model | all: CE | all: recall@5 | known: CE | known: recall@5 | unseen: CE | unseen: recall@5 |",
              "|---|---|---|---|---|---|---|"]
    for name, s in rows.items():
        cells = [LABELS.get(name, name), _fmt(s["test"].get("cross_entropy"), False, 2),
                 f"{_fmt(s['test'].get('recall@5'), True, 2)} [{_fmt_ci(s['test_bootstrap'].get('recall@5'))}]"]
        for part in TARGET_PARTS:
            p = s.get(part)
            cells += ["–", "–"] if p is None else [
                _fmt(p["test"].get("cross_entropy"), False, 2),
                f"{_fmt(p['test'].get('recall@5'), True, 2)} [{_fmt_ci(p['bootstrap'].get('recall@5'))}]"]
        lines.append("| " + " | ".join(cells) + " |")
    if "popularity_attribute" in references:
        ref = rows["popularity_attribute"]
        lines.append("")
        for v in models:
            per_metric = {m: compare_models(summary[v], ref, m, higher) for m, higher in VERDICT_METRICS}
            lines.append(f"- {LABELS.get(v, v)} against {LABELS['popularity_attribute'].lower()} (all targets): "
                         f"{_comparison_text(per_metric)}")
    # does the context still help when the articles are known by their attributes? (same cases both sides)
    none_attrs = "none" + ATTRIBUTES_SUFFIX
    context = [v for v in models if base_model(v) in VARIANTS and v != none_attrs]
    if none_attrs in summary and context:
        lines += ["", f"- Against {LABELS.get(none_attrs, none_attrs)} (all targets):"]
        for v in context:
            per_metric = {m: compare_models(summary[v], summary[none_attrs], m, higher)
                          for m, higher in VERDICT_METRICS}
            lines.append(f"  - {LABELS.get(v, v)}: {_comparison_text(per_metric)}")
    # what the attributes add to each model: its known targets against its twin of ids only (which ranks the
    # train vocabulary, the attribute model the larger catalogue: a harder task for the latter)
    twins = [v for v in models if base_model(v) in summary and "test_known" in summary[v]]
    if twins:
        lines += ["", "- Against the same model of ids only (known targets, the only ones the latter ranks):"]
        for v in twins:
            known = summary[v]["test_known"]["test"]
            per_metric = {m: compare(known[m], summary[base_model(v)]["test"][m], higher)
                          for m, higher in VERDICT_METRICS}
            lines.append(f"  - {LABELS.get(v, v)} against {LABELS.get(base_model(v), base_model(v))}: "
                         f"{_comparison_text(per_metric)}")
    return lines


# --- the table -------------------------------------------------------------------------------------------


def _fmt(stat: dict | None, percent: bool, digits: int) -> str:
    if stat is None or stat.get("mean") is None:
        return "–"
    scale = 100 if percent else 1
    text = f"{stat['mean'] * scale:.{digits}f}"
    if stat.get("se") is not None:
        text += f" ± {stat['se'] * scale:.{digits}f}"
    return text


def _fmt_ci(interval: list[float] | None) -> str:
    return "–" if interval is None else f"{interval[0] * 100:.2f}–{interval[1] * 100:.2f}"


def _count(test: dict, key: str) -> str:
    stat = test.get(key)
    return "?" if stat is None or stat["mean"] is None else f"{int(stat['mean']):,}"


def _comparison_text(per_metric: dict) -> str:
    """'cross-entropy better by +0.12 (SE 0.03): yes; recall@5 ...' from compare() per metric."""
    parts = []
    for metric, c in per_metric.items():
        scale, unit = (100, " pts") if metric.startswith("recall") else (1, "")
        if c["yardstick"] == "se":
            yardstick = f" (SE {c['se'] * scale:.2f}{unit})"
        elif c["yardstick"] == "paired bootstrap":
            low, high = (bound * scale for bound in c["ci"])
            yardstick = f" (paired bootstrap {LEVEL:.0%} CI {low:+.2f}..{high:+.2f}{unit})"
        else:
            yardstick = ""
        parts.append(f"{METRIC_LABELS[metric]} better by {c['improvement'] * scale:+.2f}{unit}{yardstick}: "
                     f"{_verdict_text(c['beats_by_more_than_se'], c.get('why'))}")
    return "; ".join(parts)


def _verdict_text(value, why: str | None = None) -> str:
    return {True: "yes", False: "no"}.get(value) or f"undetermined ({why or 'n=1, no SE'})"


def _yardstick_phrase(comparisons: list[dict]) -> str:
    """How the 'beats' of these comparisons was decided, for a sentence over all of them."""
    used = {c["yardstick"] for c in comparisons}
    if used == {"se"}:
        return "by more than the standard error"
    if used == {"paired bootstrap"}:
        return f"with the paired bootstrap's {LEVEL:.0%} interval of the difference above 0"
    return (f"by more than their yardstick (the standard error; with one seed, the paired bootstrap's "
            f"{LEVEL:.0%} interval above 0)")


def _split_words(split: dict) -> str:
    """How the features stage split the outfits (its manifest's "split")."""
    if split.get("method") != "by date":
        return "split by outfit"
    dates = [split.get(f"{name}_dates") or ["?", "?"] for name in ("train", "val", "test")]
    return "split by date: " + " / ".join(f"{a} to {b}" for a, b in dates)


def _data_lines(cfg: Config) -> list[str]:
    lines = []
    manifest_path = cfg.paths.features_dir / MANIFEST_FILE
    if manifest_path.exists():
        m = json.loads(manifest_path.read_text())
        rows = m.get("rows", {})
        lines.append(
            f"- Data: source **{m.get('source', 'unknown')}**, {rows.get('outfits', '?'):,} outfits "
            f"(train {rows.get('train', '?'):,} / validation {rows.get('val', '?'):,} / "
            f"test {rows.get('test', '?'):,}, {_split_words(m.get('split', {}))}), {rows.get('customers', '?'):,} customers, "
            f"{rows.get('articles', '?'):,} articles of which {m.get('n_items', 3) - 3:,} in the vocabulary "
            f"(d_context {m.get('d_context', '?')})."
        )
        if m.get("d_context") == 0:
            lines.append(
                f"- No context: this data (source **{m.get('source', 'unknown')}**, e.g. curated outfits without "
                "customers) has no context columns, so only the models that read none run ([None], the bag of items) "
                "beside the popularity; the context variants ([C], [NP], [GS], [GSU], the bag of items + c) would "
                "have nothing to condition on."
            )
    ingest_path = cfg.paths.raw_dir / "ingest_report.json"
    if ingest_path.exists():
        ingest = json.loads(ingest_path.read_text())
        kept = {k: v for k, v in ingest.items() if k in ("source", "rows", "quarantined") or "drop" in k}
        lines.append(f"- Ingest ({ingest_path}): `{json.dumps(kept)}`")
    return lines


def _converged_text(c: dict | None) -> str:
    if not c:
        return "?"
    ways = sorted({CONVERGENCE_LABELS[w] for w in c["ways"] if w is not None})
    return f"{c['converged']}/{c['n']}" + (f" ({', '.join(ways)})" if ways else "")


def seed_se_lines(summary: dict, metric: str = "cross_entropy") -> list[str]:
    """The seed SE of the test cross-entropy to three decimals, largest first: the table rounds to two, so a
    claim about its size is read here, never from the rounded column."""
    ses = {v: s["test"][metric]["se"] for v, s in summary.items()
           if metric in s["test"] and s["test"][metric]["se"] is not None}
    if not ses:
        return []
    largest = max(ses, key=ses.get)
    each = ", ".join(f"{LABELS.get(v, v)} {se:.3f}" for v, se in ses.items())
    lines = ["", f"- Seed SE of the test cross-entropy: at most **{ses[largest]:.3f}** nats "
                 f"({LABELS.get(largest, largest)}); each: {each}."]
    over = [v for v, se in ses.items() if se > SEED_SE_TARGET]
    lines += [f"  - {LABELS.get(v, v)} misses the {SEED_SE_TARGET} nats target: {_seed_spread_text(summary[v], metric)}"
              for v in over]
    return lines


def _seed_spread_text(s: dict, metric: str) -> str:
    """Why a row's seeds spread: each seed's test value and how its training ended, the seed furthest from the
    others named."""
    values = (s.get("test_by_seed") or {}).get(metric) or []
    seeds, c = s.get("seeds") or [], s.get("convergence") or {}
    if len(values) != len(seeds) or len(values) < 2 or None in values:
        return "the seeds' values are not in the evaluations."
    ended = [f"s{seed} {value:.3f}" + (f" (best epoch {best} of {ran}, {CONVERGENCE_LABELS.get(way, 'not converged')})"
                                       if ran is not None else "")
             for seed, value, best, ran, way in zip(seeds, values, c.get("best_epochs") or [None] * len(seeds),
                                                    c.get("epochs") or [None] * len(seeds),
                                                    c.get("ways") or [None] * len(seeds))]
    others = [np.mean([x for j, x in enumerate(values) if j != i]) for i in range(len(values))]
    far = int(np.argmax([abs(x - o) for x, o in zip(values, others)]))
    return f"{', '.join(ended)}; s{seeds[far]} is {abs(values[far] - others[far]):.3f} from the others' mean."


def _dependence_text(stat: dict | None) -> str:
    """The outfit dependence, flagged **stuck** when its mean is under STUCK_BELOW."""
    return _fmt(stat, False, 3) + (" **stuck**" if stuck(stat) else "")


def stuck(stat: dict | None) -> bool | None:
    """Is a model's outfit dependence (mean over seeds) under STUCK_BELOW? None where it was not measured."""
    return None if not stat or stat.get("mean") is None else stat["mean"] < STUCK_BELOW


def render_table1(cfg: Config, summary: dict, references: dict, verdicts: dict, order: dict,
                  baseline_verdicts: dict | None = None, yardsticks: dict | None = None,
                  unavailable: dict | None = None) -> str:
    lines = _preamble_lines(cfg, summary)
    lines += _reference_rows(references)
    lines += [_model_row(v, summary[v], (yardsticks or {}).get(v)) for v in summary]
    if unavailable:
        lines += ["", f"- Not trained on this data: {', '.join(LABELS.get(v, v) for v in unavailable)} "
                      f"({next(iter(unavailable.values()))})."]
    lines += seed_se_lines(summary)
    lines += yardstick_lines(yardsticks or {})
    lines += _optimum_lines(summary, references)
    lines += history_lines(summary, references)
    lines += attribute_lines(summary, references)
    if baseline_verdicts:
        lines += ["", "## Against the learned baselines", ""]
        for text in baseline_verdicts["lines"]:
            lines.append(f"- {text}")
    lines += _context_lines(verdicts)
    lines += _order_lines(order)
    lines += ["", "Plots: `reports/plots/recall_at_k.png`, `reports/plots/training_curves.png`.", ""]
    return "\n".join(lines)


def _preamble_lines(cfg: Config, summary: dict) -> list[str]:
    """The title, what the data and the protocol are, and the table's header."""
    seeds = cfg.train.seeds
    n = len(seeds)
    counts = next(iter(summary.values()))["test"]
    spread = f"mean ± standard error over {n} seeds {seeds} (SE = sample std / √n)" if n > 1 else \
        f"seed {seeds[0]} only (n=1, no SE)"
    return [
        "# Table 1: outfit completion on this data",
        "",
        *_data_lines(cfg),
        f"- Test split, {spread}: {_count(counts, 'n_outfits')} outfits, "
        f"{_count(counts, 'n_cases')} masked-article cases ({_count(counts, 'n_unknown_targets')} with a target outside the vocabulary). Every article of "
        "the vocabulary is ranked; the outfit's other (in-outfit) articles are excluded from the ranking.",
        "- 95% CI: percentile bootstrap over the test outfits (bootstrap.py), the bounds averaged over seeds: "
        "how much the numbers move with the test split itself, besides the seed SE.",
        "- \"Beats\": with two seeds or more on both sides, the improvement must exceed the SE of the difference; "
        "with one seed, a paired bootstrap over the test outfits (both models' cases of an outfit drawn "
        f"together) must put the whole {LEVEL:.0%} interval of the difference on the better side of 0.",
        "- FITB (fill-in-the-blank, fitb.py): each test item blanked in turn, the model picks it among "
        "evaluate.fitb.n_candidates candidates (itself and negatives not in the outfit, the same questions for every "
        "row: reports/eval/fitb_questions.csv); easy: negatives of any article, hard: of the blank's product type "
        "(or category); chance is 1 / candidates. The field's Polyvore numbers read images: not comparable "
        "(docs/curated_products.md).",
        "- Recall in %. Paper columns: Denk & Peleteiro Ramallo (2020), Table 1, 17k held-out of 380k outfits, "
        "mean of 3 runs (their own data; compare the pattern, not the numbers).",
        "",
        "- Converged: runs whose early stopping fired or whose last 3 epochs improved validation "
        "cross-entropy by less than 0.01 nats together.",
        "- Parameters: counted as the paper counts them, without the article embeddings, the output layer and "
        "the customer-feature embeddings; so the bag of items counts 0 and the bag of items + c only its "
        "projection of c.",
        "- Outfit dependence: the test cross-entropy with the encoder reading another test outfit's articles "
        "(same length, the [MASK] in place, the customer and any attribute-overlap offsets the real ones) minus "
        f"the real one, in nats (evaluation.py). Under {STUCK_BELOW} (**stuck**): the model predicts without "
        "reading the outfit, a popularity table whatever its loss.",
        "",
        "| Model | Cross-entropy | (paper) | Recall@1 % | (paper) | Recall@5 % | Recall@5 % 95% CI | Recall@250 % | "
        "FITB easy % [95% CI] | FITB hard % [95% CI] | "
        "Parameters | (paper) | Recall@1 gain vs [None] | (paper) | Converged | Outfit dependence | "
        "Against its yardstick (CE) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]


def _reference_rows(references: dict) -> list[str]:
    """The counts' (and the optimum's) rows: no seeds, no parameters."""
    lines = []
    for name, result in references.items():
        ref = {k: {"mean": v, "se": None} for k, v in result["test"].items() if isinstance(v, (int, float))}
        lines.append(
            f"| {LABELS.get(name, name)} | {_fmt(ref.get('cross_entropy'), False, 2)} | – | "
            f"{_fmt(ref.get('recall@1'), True, 2)} | – | {_fmt(ref.get('recall@5'), True, 2)} | "
            f"{_fmt_ci((result.get('test_bootstrap') or {}).get('recall@5'))} | "
            f"{_fmt(ref.get('recall@250'), True, 2)} | {' | '.join(_fitb_cells(ref, result, pooled=False))} | "
            "– | – | – | – | – | – | – |"
        )
    return lines


def _model_row(v: str, s: dict, yardstick: dict | None) -> str:
    """A learned model's row: the mean ± seed SE of each metric, the paper's beside it."""
    paper, paper_none = PAPER_TABLE1.get(v, {}), PAPER_TABLE1["none"]["recall@1"]
    gain = s.get("recall@1_gain_vs_none")
    paper_gain = paper["recall@1"] / paper_none - 1 if paper and v != "none" else None
    return "| " + " | ".join([
        LABELS.get(v, v),
        _fmt(s["test"].get("cross_entropy"), False, 2),
        f"{paper['cross_entropy']:.2f}" if paper else "–",
        _fmt(s["test"].get("recall@1"), True, 2),
        f"{paper['recall@1'] * 100:.1f}" if paper else "–",
        _fmt(s["test"].get("recall@5"), True, 2),
        _fmt_ci(s["test_bootstrap"].get("recall@5")),
        _fmt(s["test"].get("recall@250"), True, 2),
        *_fitb_cells(s["test"], s, pooled=True),
        f"{s['parameters']:,}",
        f"{paper['parameters']:,}" if paper else "–",
        "–" if gain is None else f"{gain * 100:+.1f} %",
        "–" if paper_gain is None else f"{paper_gain * 100:+.1f} %",
        _converged_text(s.get("convergence")),
        _dependence_text(s["test"].get(DEPENDENCE_METRIC)),
        _yardstick_cell(yardstick),
    ]) + " |"


def _optimum_lines(summary: dict, references: dict) -> list[str]:
    """Each model's gap to the data's exact optimum (planted data only)."""
    lines = []
    if "optimum_context" in references or "optimum_no_context" in references:
        lines += ["", "## Distance to the optimum", "",
                  "- The data's exact Bayes-optimal predictor is known: its rows are the best any model can do on "
                  "these test cases, with and without the customer. Gap in cross-entropy (nats):"]
        for v in summary:
            ce = summary[v]["test"]["cross_entropy"]["mean"]
            uses_context = base_model(v) not in ("none", "bag_of_items")
            # a model that reads c reads the history in it (features.history), and is held to that optimum
            name = (("optimum_history" if "optimum_history" in references else "optimum_context") if uses_context
                    else "optimum_no_context")
            if name in references and ce is not None:
                gap = ce - references[name]["test"]["cross_entropy"]
                lines.append(f"  - {LABELS.get(v, v)}: {gap:+.3f} to the {LABELS[name].lower()}")
    return lines


def _context_lines(verdicts: dict) -> list[str]:
    """Does every context variant beat [None]?"""
    lines = ["", "## Does context help?", ""]
    if not verdicts:
        lines.append("- [None] is not among train.variants (or no context variant is), so there is nothing to "
                     "compare against.")
    else:
        overall = verdicts["all_beat_none_by_more_than_se"]
        comparisons = [c for pv in verdicts["per_variant"].values() for c in pv.values()]
        lines.append(f"- Every context variant beats [None] on cross-entropy and recall@5 "
                     f"{_yardstick_phrase(comparisons)}: "
                     f"**{_verdict_text(overall, 'a comparison below has no yardstick')}**.")
        for v, per_metric in verdicts["per_variant"].items():
            lines.append(f"  - {LABELS.get(v, v)}: {_comparison_text(per_metric)}")
    return lines


def _order_lines(order: dict) -> list[str]:
    """The context variants' order by recall@1 against the paper's."""
    if not order:
        return []
    ours = " > ".join(LABELS.get(v, v) for v in order["ours"])
    paper = " > ".join(LABELS.get(v, v) for v in order["paper"])
    lines = [
        "",
        "## Order of the context variants by recall@1",
        "",
        f"- Ours: {ours}. Paper: {paper}. "
        f"**{'Same order' if order['matches_paper'] else 'Different order'}.**",
    ]
    if order["within_se"]:
        pairs = ", ".join(f"{LABELS.get(a, a)} vs {LABELS.get(b, b)}" for a, b in order["within_se"])
        lines.append(f"- Neighbours whose recall@1 does not differ beyond its yardstick (the SE of the "
                     f"difference; with one seed, the paired bootstrap): {pairs}.")
    return lines


# --- the stage -------------------------------------------------------------------------------------------


def yardstick_verdicts(evals: dict[str, list[dict]], summary: dict, references: dict) -> dict[str, dict]:
    """Every learned model against its yardstick (evaluation/yardstick.py): the one its evaluations name, or
    for evaluations from before it, the count that knows what the model reads."""
    out = {}
    for v, runs in evals.items():
        names = {(r.get(VERDICT_KEY) or {}).get("name") for r in runs}
        reads_history = "popularity_history" in references and base_model(v) not in ("none", "bag_of_items")
        name = names.pop() if len(names) == 1 and None not in names else yardstick_of(v, reads_history)
        if name not in references:
            out[v] = {"name": name, "verdict": None, "why": f"no {name} result (run `contextual-bert baseline`)"}
        else:
            out[v] = summary_verdict(summary[v]["test"], summary[v].get(OUTFITS_KEY), name, references[name])
    return out


def _yardstick_cell(verdict: dict | None) -> str:
    """Table 1's cell: the verdict against the row's yardstick, a worse one in bold capitals."""
    if not verdict:
        return "–"
    label = LABELS.get(verdict["name"], verdict["name"]).lower()
    if verdict["verdict"] is None:
        return f"unknown ({label})"
    word = {"better": "better than", "level": "level with", "worse": "**WORSE** than"}[verdict["verdict"]]
    return f"{word} {label} ({verdict['difference']:+.2f})"


def yardstick_lines(verdicts: dict[str, dict]) -> list[str]:
    """The section that says, for every learned row, where it stands against the count it must beat."""
    if not verdicts:
        return []
    worse = [v for v, c in verdicts.items() if c.get("verdict") == "worse"]
    lines = ["", "## Against the yardsticks", "",
             "- Each learned row against the count that knows what it reads: popularity; popularity + own history "
             "for a model whose context holds the history; the attribute-aware popularity for the models with "
             "attributes (all targets), lifted by the own history for those whose context holds it. Test "
             "cross-entropy, model minus yardstick (negative: better); better or "
             "worse beyond the SE of the difference with two seeds or more, beyond the paired bootstrap's 95% "
             "interval with one; otherwise level.",
             f"- **{len(worse)} of {len(verdicts)} learned rows are worse than their yardstick"
             + (f": {', '.join(LABELS.get(v, v) for v in worse)}.**" if worse else ".**")]
    for v, c in verdicts.items():
        if c.get("verdict") is None:
            lines.append(f"  - {LABELS.get(v, v)}: {c.get('why', 'no verdict')}")
            continue
        rule = (f"SE {c['se']:.3f}" if c.get("rule") == "se" else
                f"paired bootstrap {LEVEL:.0%} CI {c['interval'][0]:+.3f}..{c['interval'][1]:+.3f}")
        lines.append(f"  - {LABELS.get(v, v)}: {c['model']:.3f} against {LABELS.get(c['name'], c['name']).lower()} "
                     f"{c['yardstick']:.3f}, {c['difference']:+.3f} ({rule}): **{c['verdict']}**")
    return lines


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
        lines.append(f"{LABELS.get(model, model)} against {LABELS[baseline]}: {_comparison_text(per_metric)}")
    return {"checks": checks, "lines": lines}


def comparison_numbers(c: dict) -> dict:
    """A compare() result as numbers only, for `dvc metrics show`: the verdict 1 / 0, the interval as
    ci_low / ci_high, paired_bootstrap 1 (its yardstick) or 0 (the SE); what is None left out."""
    out = {k: c[k] for k in ("improvement", "se") if c.get(k) is not None}
    if c.get("ci") is not None:
        out["ci_low"], out["ci_high"] = c["ci"]
    if c["yardstick"] is not None:
        out["paired_bootstrap"] = int(c["yardstick"] == "paired bootstrap")
    if c["beats_by_more_than_se"] is not None:
        out["beats_by_more_than_se"] = int(c["beats_by_more_than_se"])
    return out


def _metrics_json(summary: dict, references: dict, verdicts: dict) -> dict:
    """Nested dicts of numbers only, for `dvc metrics show`."""
    out = {name: {"test": {k: v for k, v in result["test"].items() if isinstance(v, (int, float))}}
           for name, result in references.items()}
    for variant, s in summary.items():
        # Counts (n_outfits, n_cases, ...) are the same for every seed: one number, no SE.
        entry = {"test": {m: stat["mean"] if m.startswith("n_") else
                          {k: v for k, v in stat.items() if k in ("mean", "se") and v is not None}
                          for m, stat in s["test"].items()},
                 "parameters": s["parameters"], "n_seeds": s["n_seeds"]}
        if s.get("recall@1_gain_vs_none") is not None:
            entry["recall@1_gain_vs_none"] = s["recall@1_gain_vs_none"]
        if s.get("convergence"):
            entry["converged_runs"] = s["convergence"]["converged"]
        for metric, c in verdicts.get("per_variant", {}).get(variant, {}).items():
            entry.setdefault("vs_none", {})[metric] = comparison_numbers(c)
        out[variant] = entry
    return out


def build_report(cfg: Config) -> dict:
    """Write reports/table1.md, reports/metrics.json and reports/plots/; return a summary."""
    variants, seeds = list(cfg.train.variants), list(cfg.train.seeds)
    if not variants or not seeds:
        raise ContextualBertError("params.yaml: train.variants and train.seeds must not be empty")
    results = {v: [_read_json(cfg.eval_path(f"{v}-s{s}"), "evaluation result (run `contextual-bert evaluate`)")
                   for s in seeds] for v in variants}
    # a model this data cannot train (e.g. a context variant on outfits without customers): said, not a row
    unavailable = {v: runs[0].get("why") for v, runs in results.items() if all(r.get("known") is False for r in runs)}
    variants = [v for v in variants if v not in unavailable]
    if not variants:
        raise ContextualBertError(f"no model of train.variants could be trained on this data: {unavailable}")
    evals = {v: [checked_eval(r, cfg.eval_path(f"{v}-s{s}")) for r, s in zip(results[v], seeds)] for v in variants}
    references = read_references(cfg)
    popularity = references["popularity"]
    histories = {v: {s: read_history(cfg.run_dir(v, s) / CURVE_FILE) for s in seeds} for v in variants}

    summary = {v: summarize_runs(runs) for v, runs in evals.items()}
    for v in variants:
        paths = [cfg.run_dir(v, s) / "metrics.json" for s in seeds]
        if all(p.exists() for p in paths):
            summary[v]["convergence"] = convergence_summary([_read_json(p, "training metrics") for p in paths])
    context_variants = [v for v in variants if v in VARIANTS and v != "none"]
    verdicts, order = {}, {}
    if "none" in summary:
        none = summary["none"]["test"]
        for v in context_variants:
            baseline_r1 = none["recall@1"]["mean"]
            summary[v]["recall@1_gain_vs_none"] = \
                summary[v]["test"]["recall@1"]["mean"] / baseline_r1 - 1 if baseline_r1 else None
        if context_variants:
            per_variant = {v: {m: compare_models(summary[v], summary["none"], m, higher)
                               for m, higher in VERDICT_METRICS} for v in context_variants}
            flags = [c["beats_by_more_than_se"] for pv in per_variant.values() for c in pv.values()]
            overall = False if False in flags else (None if None in flags else True)
            verdicts = {"all_beat_none_by_more_than_se": overall, "per_variant": per_variant}
    if len(context_variants) > 1:
        ours = sorted(context_variants, key=lambda v: -summary[v]["test"]["recall@1"]["mean"])
        paper = [v for v in PAPER_ORDER if v in context_variants]
        within = [(a, b) for a, b in zip(ours, ours[1:])
                  if compare_models(summary[a], summary[b], "recall@1", True)["beats_by_more_than_se"] is False]
        order = {"ours": ours, "paper": paper, "matches_paper": ours == paper, "within_se": within}

    baseline_verdicts = against_learned_baselines(summary, context_variants)
    yardsticks = yardstick_verdicts(evals, summary, references)

    reports_dir = cfg.paths.reports_dir
    reports_dir.mkdir(parents=True, exist_ok=True)
    (reports_dir / "table1.md").write_text(
        render_table1(cfg, summary, references, verdicts, order, baseline_verdicts, yardsticks, unavailable))
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

    plots = write_plots(reports_dir / "plots", evals, popularity, histories, LABELS)
    return {
        "table": str(reports_dir / "table1.md"),
        "metrics": str(reports_dir / "metrics.json"),
        "plots": [str(p) for p in plots],
        "summary": {v: {m: s["test"][m] for m in REQUIRED_METRICS} | {"parameters": s["parameters"]}
                    for v, s in summary.items()},
        "all_beat_none_by_more_than_se": verdicts.get("all_beat_none_by_more_than_se"),
        "vs_learned_baselines": (baseline_verdicts or {}).get("checks"),
        "vs_yardstick": {v: {"name": c["name"], "verdict": c.get("verdict")} for v, c in yardsticks.items()},
        "order_by_recall@1": order.get("ours"),
        "order_matches_paper": order.get("matches_paper"),
    }
