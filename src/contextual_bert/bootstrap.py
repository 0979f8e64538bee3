"""Bootstrap confidence intervals over test outfits: how much a metric moves with the test split itself.

The standard error over seeds says how much training varies; on a small test split the split's own
sampling varies as much or more. Cases (outfit, masked position) of one outfit are not independent, so
the resampling unit is the outfit: draw as many outfits as the split has, with replacement, and recompute
each metric as the mean over the drawn outfits' cases. The interval is the percentile interval of
`n_resamples` draws, from a fixed seed (the same case data gives the same interval).
"""

from __future__ import annotations

import numpy as np

N_RESAMPLES = 1000
LEVEL = 0.95
CI_METRICS = ("cross_entropy", "recall@1", "recall@5", "recall@10")


def bootstrap_ci(outfit: np.ndarray, values: dict[str, np.ndarray], n_outfits: int,
                 n_resamples: int = N_RESAMPLES, level: float = LEVEL, seed: int = 0) -> dict:
    """Percentile intervals of case means, resampling outfits. `outfit`: the outfit (0..n_outfits-1) of
    each case; `values`: metric -> per-case value (e.g. -log p, rank <= k). Returns metric -> [low, high]
    (None when there are no cases) and the settings used."""
    outfit = np.asarray(outfit, dtype=np.int64)
    per_outfit_cases = np.bincount(outfit, minlength=n_outfits).astype(np.float64)
    sums = {m: np.bincount(outfit, weights=np.asarray(v, dtype=np.float64), minlength=n_outfits)
            for m, v in values.items()}  # fmt: skip
    out = {"n_resamples": n_resamples, "level": level, "unit": "test outfits", "seed": seed}
    if len(outfit) == 0 or n_outfits == 0:
        return out | {m: None for m in values}
    rng = np.random.default_rng(seed)
    draws = {m: [] for m in values}
    for start in range(0, n_resamples, 100):  # 100 resamples at a time bounds the memory
        counts = rng.multinomial(n_outfits, np.full(n_outfits, 1.0 / n_outfits), size=min(100, n_resamples - start))
        cases = counts @ per_outfit_cases
        for m in values:
            draws[m].append(np.divide(counts @ sums[m], cases, out=np.full(len(cases), np.nan), where=cases > 0))
    tail = (1 - level) / 2 * 100
    for m, chunks in draws.items():
        low, high = np.nanpercentile(np.concatenate(chunks), [tail, 100 - tail])
        out[m] = [float(low), float(high)]
    return out


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
    intervals = [i for i in intervals if i is not None]
    if not intervals:
        return None
    return [float(np.mean([i[0] for i in intervals])), float(np.mean([i[1] for i in intervals]))]
