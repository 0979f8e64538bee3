import numpy as np
import pytest

from contextual_bert.evaluation.bootstrap import (
    bootstrap_ci,
    case_values,
    mean_record,
    outfit_record,
    paired_difference,
    pooled_interval,
)


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


def _record(ids, cases, ce_sums):
    return {"outfit_id": list(ids), "cases": list(cases), "sums": {"cross_entropy": list(ce_sums)}}


def test_paired_difference_of_a_model_better_on_every_outfit_is_clear_of_0():
    # b loses 0.1 to 0.3 nats a case to a on every one of 40 outfits, whose own difficulty varies a lot
    rng = np.random.default_rng(0)
    cases = rng.integers(1, 8, 40)
    a = rng.uniform(2, 9, 40) * cases
    gap = rng.uniform(0.1, 0.3, 40) * cases
    better, worse = _record(range(40), cases, a), _record(range(40), cases, a + gap)
    result = paired_difference(worse, better, "cross_entropy")
    assert result["difference"] == pytest.approx(gap.sum() / cases.sum())
    low, high = result["interval"]
    assert 0.1 < low <= result["difference"] <= high < 0.3
    assert result["n_outfits"] == 40 and paired_difference(worse, better, "cross_entropy") == result
    # the pairing is what makes it clear: unpaired, the outfits' difficulty swamps the gap
    unpaired = bootstrap_ci(np.repeat(np.arange(40), cases), {"ce": np.repeat(a / cases, cases)}, 40)["ce"]
    assert unpaired[1] - unpaired[0] > 5 * (high - low)


def test_identical_models_differ_by_exactly_0():
    record = _record(["o1", "o2", "o3"], [3, 1, 4], [6.0, 2.5, 9.1])
    result = paired_difference(record, _record(["o3", "o1", "o2"], [4, 3, 1], [9.1, 6.0, 2.5]), "cross_entropy")
    assert result["difference"] == 0.0 and result["interval"] == [0.0, 0.0]  # paired on ids, not on order


def test_pairing_refuses_records_of_different_cases():
    a = _record(["o1", "o2", "o3"], [3, 1, 4], [6.0, 2.5, 9.1])
    fewer = _record(["o1", "o2", "o3"], [3, 1, 3], [6.0, 2.5, 7.0])  # skips a target the other ranks
    result = paired_difference(a, fewer, "cross_entropy")
    assert result["interval"] is None and result["difference"] is None
    assert "different cases of 1 test outfit(s)" in result["why"]
    # an outfit with cases that one side does not have at all is a mismatch too; one without cases is not
    assert paired_difference(a, _record(["o1", "o2"], [3, 1], [6.0, 2.5]), "cross_entropy")["interval"] is None
    with_empty = _record(["o1", "o2", "o3", "o4"], [3, 1, 4, 0], [6.0, 2.5, 9.1, 0.0])
    assert paired_difference(a, with_empty, "cross_entropy")["interval"] == [0.0, 0.0]
    assert "no per-outfit recall@5" in paired_difference(a, a, "recall@5")["why"]


def test_outfit_record_sums_and_the_mean_over_seeds():
    outfit = np.array([0, 0, 2, 2, 2])
    values = case_values(np.array([1, 6, 2, 20, 5]), np.log(np.array([0.5, 0.1, 0.2, 0.01, 0.3])))
    record = outfit_record(outfit, values, ["x", "y", "z"])
    assert record["outfit_id"] == ["x", "y", "z"] and record["cases"] == [2, 0, 3]
    assert record["sums"]["recall@5"] == [1.0, 0.0, 2.0]
    assert sum(record["sums"]["cross_entropy"]) / 5 == pytest.approx(values["cross_entropy"].mean(), abs=1e-9)
    other = record | {"sums": {m: [2 * v for v in s] for m, s in record["sums"].items()}}
    assert mean_record([record, other])["sums"]["recall@5"] == [1.5, 0.0, 3.0]
    assert mean_record([record, None]) is None and mean_record([record, record | {"cases": [2, 1, 2]}]) is None
