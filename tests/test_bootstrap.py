import numpy as np
import pytest

from contextual_bert.bootstrap import bootstrap_ci, case_values, pooled_interval


def test_interval_holds_the_estimate_and_narrows_with_more_outfits():
    rng = np.random.default_rng(0)

    def width(n_outfits):
        outfit = np.repeat(np.arange(n_outfits), 5)
        hits = (rng.random(len(outfit)) < 0.3).astype(float)
        ci = bootstrap_ci(outfit, {"recall@5": hits}, n_outfits)
        low, high = ci["recall@5"]
        assert low <= hits.mean() <= high
        return high - low

    small, large = width(20), width(2000)
    assert small > 4 * large  # ~ sqrt(100) narrower with 100 times the outfits
    assert 0.05 < small < 0.5


def test_outfits_are_the_unit_and_the_interval_is_reproducible():
    # two outfits: one all hits, one all misses, many cases each: resampling outfits, not cases, gives a wide
    # interval (the mean is 0, 0.5 or 1 with a resample of two outfits)
    outfit = np.repeat([0, 1], 50)
    hits = np.repeat([1.0, 0.0], 50)
    ci = bootstrap_ci(outfit, {"recall@1": hits}, 2)
    assert ci["recall@1"] == [0.0, 1.0] and ci["unit"] == "test outfits"
    assert bootstrap_ci(outfit, {"recall@1": hits}, 2) == ci


def test_case_values_and_pooling():
    values = case_values(np.array([1, 3, 7, 20]), np.log(np.array([0.5, 0.25, 0.1, 0.01])))
    assert values["recall@1"].tolist() == [1, 0, 0, 0] and values["recall@5"].tolist() == [1, 1, 0, 0]
    assert values["recall@10"].tolist() == [1, 1, 1, 0]
    assert values["cross_entropy"].mean() == pytest.approx(-np.log([0.5, 0.25, 0.1, 0.01]).mean())
    assert pooled_interval([[0.1, 0.3], [0.2, 0.4], None]) == pytest.approx([0.15, 0.35])
    assert pooled_interval([None]) is None
    assert bootstrap_ci(np.array([], dtype=int), {"recall@1": np.array([])}, 0)["recall@1"] is None
