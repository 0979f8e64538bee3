"""Table 1's cells as text: numbers with their SE and CI, verdicts, convergence, the seeds' spread, the outfit dependence."""

from __future__ import annotations

import numpy as np

from contextual_bert.evaluation.bootstrap import LEVEL
from contextual_bert.evaluation.fitb import METRICS as FITB_METRICS
from contextual_bert.evaluation.fitb import RESULT_KEY as FITB_KEY
from contextual_bert.evaluation.ranking import STUCK_BELOW
from contextual_bert.evaluation.report_stats import fitb_interval

METRIC_LABELS = {"cross_entropy": "cross-entropy", "recall@5": "recall@5"}


CONVERGENCE_LABELS = {"early_stopping": "early stop", "plateau": "plateau"}


def _fitb_cells(test: dict, result: dict, pooled: bool) -> list[str]:
    """FITB easy and hard accuracy % [95% CI] (a summary's pooled intervals, or one result's)."""
    intervals = {m: (result.get(FITB_KEY) or {}).get(m) if pooled else fitb_interval(result, m) for m in FITB_METRICS}
    return [
        f"{_fmt(test.get(m), True, 1)} [{_fmt_ci(intervals[m])}]" if test.get(m) is not None else "–"
        for m in FITB_METRICS
    ]


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


def comparison_text(per_metric: dict) -> str:
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
        parts.append(
            f"{METRIC_LABELS[metric]} better by {c['improvement'] * scale:+.2f}{unit}{yardstick}: "
            f"{_verdict_text(c['beats_by_more_than_se'], c.get('why'))}"
        )
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
    return (
        f"by more than their yardstick (the standard error; with one seed, the paired bootstrap's "
        f"{LEVEL:.0%} interval above 0)"
    )


def _split_words(split: dict) -> str:
    """How the features stage split the outfits (its manifest's "split")."""
    if split.get("method") != "by date":
        return "split by outfit"
    dates = [split.get(f"{name}_dates") or ["?", "?"] for name in ("train", "val", "test")]
    return "split by date: " + " / ".join(f"{a} to {b}" for a, b in dates)


def _converged_text(c: dict | None) -> str:
    if not c:
        return "?"
    ways = sorted({CONVERGENCE_LABELS[w] for w in c["ways"] if w is not None})
    return f"{c['converged']}/{c['n']}" + (f" ({', '.join(ways)})" if ways else "")


def _seed_spread_text(s: dict, metric: str) -> str:
    """Why a row's seeds spread: each seed's test value and how its training ended, the seed furthest from the
    others named."""
    values = (s.get("test_by_seed") or {}).get(metric) or []
    seeds, c = s.get("seeds") or [], s.get("convergence") or {}
    if len(values) != len(seeds) or len(values) < 2 or None in values:
        return "the seeds' values are not in the evaluations."
    ended = [
        f"s{seed} {value:.3f}"
        + (f" (best epoch {best} of {ran}, {CONVERGENCE_LABELS.get(way, 'not converged')})" if ran is not None else "")
        for seed, value, best, ran, way in zip(
            seeds,
            values,
            c.get("best_epochs") or [None] * len(seeds),
            c.get("epochs") or [None] * len(seeds),
            c.get("ways") or [None] * len(seeds),
        )
    ]
    others = [np.mean([x for j, x in enumerate(values) if j != i]) for i in range(len(values))]
    far = int(np.argmax([abs(x - o) for x, o in zip(values, others)]))
    return f"{', '.join(ended)}; s{seeds[far]} is {abs(values[far] - others[far]):.3f} from the others' mean."


def _dependence_text(stat: dict | None) -> str:
    """The outfit dependence, flagged **stuck** when its mean is under STUCK_BELOW."""
    return _fmt(stat, False, 3) + (" **stuck**" if stuck(stat) else "")


def stuck(stat: dict | None) -> bool | None:
    """Is a model's outfit dependence (mean over seeds) under STUCK_BELOW? None where it was not measured."""
    return None if not stat or stat.get("mean") is None else stat["mean"] < STUCK_BELOW
