"""The report's statistics: each model's results over seeds (mean and SE), the "beats" comparisons (the SE of the
difference, or with one seed the paired bootstrap), convergence, and every learned model against its yardstick.
Table 1 (`table1.py`) and reports/metrics.json (`report.py`) show these numbers."""

from __future__ import annotations

import math

import numpy as np

from contextual_bert.config import base_model
from contextual_bert.evaluation.bootstrap import (
    CI_METRICS,
    KNOWN_OUTFITS_KEY,
    OUTFITS_KEY,
    mean_record,
    paired_difference,
    pooled_interval,
)
from contextual_bert.evaluation.fitb import METRICS as FITB_METRICS
from contextual_bert.evaluation.fitb import RESULT_KEY as FITB_KEY
from contextual_bert.evaluation.yardstick import VERDICT_KEY, summary_verdict, yardstick_of

# (metric, True when higher is better) for the "beats [None]" verdicts.
VERDICT_METRICS = (("cross_entropy", False), ("recall@5", True))


TARGET_PARTS = ("test_known", "test_unseen")  # the catalogue rankers' targets with and without an id


def convergence_summary(metrics: list[dict]) -> dict:
    """How many of a model's runs converged (training.convergence), and how."""
    ways = [m.get("converged") for m in metrics]
    return {
        "converged": sum(w is not None for w in ways),
        "n": len(ways),
        "ways": ways,
        "best_epochs": [m.get("best_epoch") for m in metrics],
        "epochs": [m.get("epochs") for m in metrics],
    }


# --- statistics ------------------------------------------------------------------------------------------


def mean_se(values) -> dict:
    """{"mean", "se", "n"}; se is None for a single value."""
    values = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if len(values) == 0:
        return {"mean": None, "se": None, "n": 0}
    se = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None
    return {"mean": float(values.mean()), "se": se, "n": int(len(values))}


def compare(
    ours: dict,
    baseline: dict,
    higher_is_better: bool,
    metric: str | None = None,
    outfits: tuple[dict | None, dict | None] = (None, None),
) -> dict:
    """How much `ours` improves on `baseline` (positive = better) and whether it beats it
    ("beats_by_more_than_se"), by one of two yardsticks:

    - "se": both sides have >= 2 seeds; beats when the improvement exceeds the SE of the difference.
    - "paired bootstrap": a side has one seed and `outfits` (the two sides' per-outfit records) pair on the
      same test cases; "ci" is the interval of the improvement and it beats when all of it is above 0.

    Otherwise the verdict is None and "why" says why."""
    improvement = ours["mean"] - baseline["mean"]
    if not higher_is_better:
        improvement = -improvement
    out = {"improvement": improvement, "se": None, "yardstick": None, "beats_by_more_than_se": None}
    if ours["se"] is not None and baseline["se"] is not None:
        se = math.sqrt(ours["se"] ** 2 + baseline["se"] ** 2)
        return out | {"se": se, "yardstick": "se", "beats_by_more_than_se": bool(improvement > se)}
    mine, theirs = outfits
    if metric is None or mine is None or theirs is None:
        return out | {"why": "n=1, no per-outfit cases"}
    paired = paired_difference(mine, theirs, metric)
    if paired["interval"] is None:
        return out | {"why": f"n=1, {paired['why']}"}
    sign = 1.0 if higher_is_better else -1.0
    low, high = sorted(sign * bound + 0.0 for bound in paired["interval"])  # + 0.0: no "-0.00" in the text
    return out | {"yardstick": "paired bootstrap", "ci": [low, high], "beats_by_more_than_se": bool(low > 0)}


def compare_models(a: dict, b: dict, metric: str, higher_is_better: bool) -> dict:
    """compare() of two summaries (summarize_runs, or a reference's) on one metric, with their records."""
    return compare(
        a["test"][metric], b["test"][metric], higher_is_better, metric, (a.get(OUTFITS_KEY), b.get(OUTFITS_KEY))
    )


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
        "test_bootstrap": {
            m: pooled_interval([(e.get("test_bootstrap") or {}).get(m) for e in evals]) for m in CI_METRICS
        },
        FITB_KEY: {m: pooled_interval([fitb_interval(e, m) for e in evals]) for m in FITB_METRICS},
        # models that rank the catalogue: targets with an id embedding (known) and without (unseen) apart
        **{
            part: {
                "test": {m: mean_se([e[part].get(m) for e in evals]) for m in e0_metrics(evals, part)},
                "bootstrap": {
                    m: pooled_interval([(e.get(f"{part}_bootstrap") or {}).get(m) for e in evals]) for m in CI_METRICS
                },
            }
            for part in TARGET_PARTS
            if all(part in e for e in evals)
        },
    }


def fitb_interval(result: dict, metric: str) -> list[float] | None:
    """The bootstrap interval of one evaluation's FITB accuracy (fitb.py), None where it has none."""
    return ((result.get(FITB_KEY) or {}).get(metric.removeprefix("fitb_")) or {}).get("ci")


def e0_metrics(evals: list[dict], part: str) -> list[str]:
    return sorted({k for e in evals for k, v in e[part].items() if isinstance(v, (int, float))})


# --- against the yardsticks -------------------------------------------------------------------------------


def yardstick_verdicts(evals: dict[str, list[dict]], summary: dict, references: dict) -> dict[str, dict]:
    """Every learned model against its yardstick (evaluation/yardstick.py): the one its evaluations name, or
    for evaluations from before it, the count that knows what the model reads."""
    out = {}
    for v, runs in evals.items():
        names = {(r.get(VERDICT_KEY) or {}).get("name") for r in runs}
        reads_history = "popularity_history" in references and base_model(v) not in ("none", "bag_of_items")
        name = names.pop() if len(names) == 1 and None not in names else yardstick_of(v, reads_history)
        if name is None or name not in references:
            out[v] = {"name": name, "verdict": None, "why": f"no {name} result (run `contextual-bert baseline`)"}
        else:
            out[v] = summary_verdict(summary[v]["test"], summary[v].get(OUTFITS_KEY), name, references[name])
    return out


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
