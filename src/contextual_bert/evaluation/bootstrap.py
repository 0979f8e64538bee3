"""Bootstrap confidence intervals over test outfits: how much a metric moves with the test split itself.

The standard error over seeds says how much training varies; on a small test split the split's own
sampling varies as much or more. Cases (outfit, masked position) of one outfit are not independent, so
the resampling unit is the outfit: draw as many outfits as the split has, with replacement, and recompute
each metric as the mean over the drawn outfits' cases. The interval is the percentile interval of
`n_resamples` draws, from a fixed seed (the same case data gives the same interval).

The paired bootstrap compares two models on the same test cases: each model's per-outfit sums
(`outfit_record`, stored in the evaluation JSON) are paired on the outfit ids, and the difference of the two
models' means is resampled by outfit, so what both models find hard in an outfit cancels out.
"""

from __future__ import annotations

import numpy as np

N_RESAMPLES = 1000
LEVEL = 0.95
CI_METRICS = ("cross_entropy", "recall@1", "recall@5", "recall@10")
OUTFITS_KEY = "test_outfits"  # the evaluation JSON's per-outfit record (outfit_record)
KNOWN_OUTFITS_KEY = "test_known_outfits"  # a catalogue ranker's record of its targets with an id embedding alone
DEPENDENCE_METRIC = "outfit_dependence"  # the evaluation JSON's outfit dependence (evaluation.py), read by table1.py
SUM_DIGITS = 9  # per-outfit sums in the JSON: far below 1e-6 nats, yet a short number


def _per_outfit(outfit: np.ndarray, values: dict[str, np.ndarray], n_outfits: int) -> tuple[np.ndarray, dict]:
    """Number of cases and metric -> sum of the case values, per outfit 0..n_outfits-1."""
    outfit = np.asarray(outfit, dtype=np.int64)
    cases = np.bincount(outfit, minlength=n_outfits).astype(np.float64)
    sums = {m: np.bincount(outfit, weights=np.asarray(v, dtype=np.float64), minlength=n_outfits)
            for m, v in values.items()}  # fmt: skip
    return cases, sums


def _resampled_means(
    cases: np.ndarray, sums: dict[str, np.ndarray], n_resamples: int, seed: int
) -> dict[str, np.ndarray]:
    """metric -> the case mean of each of n_resamples draws of len(cases) outfits with replacement."""
    n_outfits = len(cases)
    rng = np.random.default_rng(seed)
    draws: dict[str, list[np.ndarray]] = {m: [] for m in sums}
    for start in range(0, n_resamples, 100):  # 100 resamples at a time bounds the memory
        counts = rng.multinomial(n_outfits, np.full(n_outfits, 1.0 / n_outfits), size=min(100, n_resamples - start))
        drawn = counts @ cases
        for m, s in sums.items():
            draws[m].append(np.divide(counts @ s, drawn, out=np.full(len(drawn), np.nan), where=drawn > 0))
    return {m: np.concatenate(chunks) for m, chunks in draws.items()}


def _percentile_interval(draws: np.ndarray, level: float) -> list[float]:
    tail = (1 - level) / 2 * 100
    low, high = np.nanpercentile(draws, [tail, 100 - tail])
    return [float(low), float(high)]


def bootstrap_ci(
    outfit: np.ndarray,
    values: dict[str, np.ndarray],
    n_outfits: int,
    n_resamples: int = N_RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> dict:
    """Percentile intervals of case means, resampling outfits. `outfit`: the outfit (0..n_outfits-1) of
    each case; `values`: metric -> per-case value (e.g. -log p, rank <= k). Returns metric -> [low, high]
    (None when there are no cases) and the settings used."""
    out = {"n_resamples": n_resamples, "level": level, "unit": "test outfits", "seed": seed}
    if len(outfit) == 0 or n_outfits == 0:
        return out | {m: None for m in values}
    cases, sums = _per_outfit(outfit, values, n_outfits)
    draws = _resampled_means(cases, sums, n_resamples, seed)
    return out | {m: _percentile_interval(d, level) for m, d in draws.items()}


def case_values(ranks: np.ndarray, log_probs: np.ndarray) -> dict[str, np.ndarray]:
    """Per-case values whose means are the CI_METRICS."""
    ranks = np.asarray(ranks)
    values = {"cross_entropy": -np.asarray(log_probs, dtype=np.float64)}
    for metric in CI_METRICS:
        if metric.startswith("recall@"):
            values[metric] = (ranks <= int(metric.split("@")[1])).astype(np.float64)
    return values


def pooled_interval(intervals: list[list[float] | None]) -> list[float] | None:
    """One interval for a mean over seeds: the mean of the seeds' bounds (each seed's test split is the same
    outfits, so their intervals overlap heavily; averaging the bounds keeps the split's sampling width)."""
    bounds = [i for i in intervals if i is not None]
    if not bounds:
        return None
    return [float(np.mean([i[0] for i in bounds])), float(np.mean([i[1] for i in bounds]))]


# --- pairing two models on the same test outfits ----------------------------------------------------------


def outfit_record(outfit: np.ndarray, values: dict[str, np.ndarray], outfit_ids: list) -> dict:
    """Per test outfit (`outfit_ids[i]` for row i, every row, with or without cases): its id, its number of
    cases and metric -> the sum of its cases' values; sum / cases over all outfits is the split's metric."""
    cases, sums = _per_outfit(outfit, values, len(outfit_ids))
    return {
        "outfit_id": list(outfit_ids),
        "cases": cases.astype(np.int64).tolist(),
        "sums": {m: np.round(s, SUM_DIGITS).tolist() for m, s in sums.items()},
    }


def mean_record(records: list[dict | None]) -> dict | None:
    """The record of a mean over seeds (their sums averaged); None unless every seed has a record of the
    same outfits and cases (the same test split)."""
    seeds = [r for r in records if r is not None]
    if not records or len(seeds) < len(records):
        return None
    first = seeds[0]
    if any(r["outfit_id"] != first["outfit_id"] or r["cases"] != first["cases"] for r in seeds[1:]):
        return None
    metrics = [m for m in first["sums"] if all(m in r["sums"] for r in seeds)]
    return {
        "outfit_id": first["outfit_id"],
        "cases": first["cases"],
        "sums": {m: np.mean([r["sums"][m] for r in seeds], axis=0).tolist() for m in metrics},
    }


def _paired_sums(a: dict, b: dict, metric: str) -> tuple[np.ndarray, np.ndarray] | str:
    """(cases, a's sums - b's sums) of the outfits with cases, paired on outfit id; or why they do not pair.
    An outfit one record lacks has no cases there: cases must match outfit by outfit, or the two models
    were measured on different cases (e.g. one skips the targets unseen in training, one ranks them)."""
    if metric not in a["sums"] or metric not in b["sums"]:
        return f"no per-outfit {metric} on both sides"
    ids = list(dict.fromkeys([*a["outfit_id"], *b["outfit_id"]]))

    def aligned(record: dict) -> tuple[np.ndarray, np.ndarray]:
        position = {o: i for i, o in enumerate(record["outfit_id"])}
        take = np.array([position.get(o, -1) for o in ids], dtype=np.int64)
        cases, sums = (
            np.append(np.asarray(v, dtype=np.float64), 0.0)[take]  # absent (-1): the appended 0
            for v in (record["cases"], record["sums"][metric])
        )
        return cases, sums

    (cases_a, sums_a), (cases_b, sums_b) = aligned(a), aligned(b)
    differ = int((cases_a != cases_b).sum())
    if differ:
        return f"the two were measured on different cases of {differ} test outfit(s)"
    keep = cases_a > 0
    if not keep.any():
        return "no test cases"
    return cases_a[keep], sums_a[keep] - sums_b[keep]


def paired_difference(
    a: dict, b: dict, metric: str, n_resamples: int = N_RESAMPLES, level: float = LEVEL, seed: int = 0
) -> dict:
    """Mean of `metric` under record `a` minus under record `b` (outfit_record) on the same test cases, and
    its percentile interval resampling the paired outfits. "interval" is None, and "why" says why, when the
    records do not cover the same cases."""
    paired = _paired_sums(a, b, metric)
    if isinstance(paired, str):
        return {"difference": None, "interval": None, "why": paired}
    cases, difference = paired
    draws = _resampled_means(cases, {metric: difference}, n_resamples, seed)[metric]
    return {
        "difference": float(difference.sum() / cases.sum()),
        "interval": _percentile_interval(draws, level),
        "n_outfits": len(cases),
        "n_resamples": n_resamples,
        "level": level,
        "seed": seed,
    }
