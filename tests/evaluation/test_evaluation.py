import json
import math

import numpy as np
import pytest
import torch

from contextual_bert.config import EvaluateConfig, ModelConfig
from contextual_bert.data.feature_spec import (
    HISTORY_FEATURE,
    MASK_INDEX,
    N_SPECIAL,
    PAD_INDEX,
    UNKNOWN_INDEX,
    ContextSpec,
    EncodedOutfits,
    FeatureSpec,
)
from contextual_bert.evaluation.bootstrap import paired_difference
from contextual_bert.evaluation.counts import PopularityModel
from contextual_bert.evaluation.evaluate import (
    evaluate_popularity,
    evaluate_run,
    metrics_from_ranks,
    outfit_dependence,
    recall_curve,
)
from contextual_bert.evaluation.ranking import case_ranks, donor_outfits, measures_dependence
from contextual_bert.evaluation.yardstick import verdict_of
from contextual_bert.model import ContextualBert, count_paper_parameters, save_checkpoint

# Articles 3..8 with fixed scores; the special indices get the highest scores and must still never be ranked.
SCORES = torch.tensor([9.0, 9.0, 9.0, 0.5, 2.0, 1.0, 3.0, 1.0, -1.0])
# By score, ties by index: 6 (3.0), 4 (2.0), 5 (1.0), 7 (1.0), 3 (0.5), 8 (-1.0).
OUTFITS = torch.tensor([[4, 6, 3, 0], [5, UNKNOWN_INDEX, 8, 0], [7, 3, 0, 0]])
# Case by case (others in the outfit excluded):
#   outfit 0: 4 among {4,5,7,8} -> 1;  6 among {5,6,7,8} -> 1;  3 among {3,5,7,8} -> 3
#   outfit 1: 5 among {3,4,5,6,7} -> 3;  [UNK] skipped;  8 among {3,4,6,7,8} -> 5
#   outfit 2: 7 among {4,5,6,7,8} -> 4 (5 ties and comes first);  3 among {3,4,5,6,8} -> 4
EXPECTED_RANKS = [1, 1, 3, 3, 5, 4, 4]
EXPECTED_TARGETS = [4, 6, 3, 5, 8, 7, 3]


class FixedScores:
    """A scorer that ignores its input but checks what case_ranks feeds it."""

    n_items = len(SCORES)

    def __init__(self):
        self.seen = []

    def eval(self):
        return self

    def masked_logits(self, items, context):
        assert ((items == MASK_INDEX).sum(dim=1) == 1).all()
        self.seen.append(items.clone())
        return SCORES.expand(len(items), -1).clone()


def test_case_ranks_match_ranks_computed_by_hand():
    scorer = FixedScores()
    cases = case_ranks(scorer, EncodedOutfits(OUTFITS), batch_size=3, device="cpu")
    assert cases["rank"].tolist() == EXPECTED_RANKS
    assert cases["target"].tolist() == EXPECTED_TARGETS
    assert cases["outfit"].tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert cases["position"].tolist() == [0, 1, 2, 0, 2, 0, 1]
    assert int(cases["n_unknown_targets"]) == 1
    log_z = math.log(sum(math.exp(s) for s in SCORES[N_SPECIAL:].tolist()))  # specials not in the softmax
    np.testing.assert_allclose(cases["log_prob"], [SCORES[t].item() - log_z for t in EXPECTED_TARGETS], rtol=1e-6)
    # Every case is its outfit with exactly the target masked, trimmed to its batch's longest outfit (the
    # cases go in order of outfit length).
    width = OUTFITS.shape[1]
    fed = torch.cat([torch.nn.functional.pad(batch, (0, width - batch.shape[1])) for batch in scorer.seen])
    expected = []
    for o, p in zip(cases["outfit"], cases["position"]):
        row = OUTFITS[o].clone()
        row[p] = MASK_INDEX
        expected.append(row.tolist())
    assert sorted(fed.tolist()) == sorted(expected)
    assert [MASK_INDEX, UNKNOWN_INDEX, 8, 0] in fed.tolist() and [MASK_INDEX, 3, 0, 0] in fed.tolist()
    assert max(batch.shape[1] for batch in scorer.seen) < width  # no outfit fills the width: all trimmed


def test_metrics_match_hand_computation():
    log_probs = np.log([0.5, 0.25, 0.1, 0.1, 0.05, 0.2, 0.2])
    m = metrics_from_ranks(EXPECTED_RANKS, log_probs, ks=(1, 3, 5))
    assert m["n_cases"] == 7
    assert m["recall@1"] == pytest.approx(2 / 7)
    assert m["recall@3"] == pytest.approx(4 / 7)
    assert m["recall@5"] == pytest.approx(1.0)
    assert m["mrr"] == pytest.approx((1 + 1 + 1 / 3 + 1 / 3 + 1 / 5 + 1 / 4 + 1 / 4) / 7)
    assert m["ndcg@10"] == pytest.approx((1 + 1 + 0.5 + 0.5 + 1 / math.log2(6) + 2 / math.log2(5)) / 7)
    assert m["cross_entropy"] == pytest.approx(-np.mean(log_probs))

    beyond = metrics_from_ranks([1, 2, 11], [-1.0, -2.0, -3.0], ks=(1, 2, 10))
    assert beyond["recall@2"] == pytest.approx(2 / 3) and beyond["recall@10"] == pytest.approx(2 / 3)
    assert beyond["ndcg@10"] == pytest.approx((1 + 1 / math.log2(3)) / 3)  # rank 11 adds nothing
    assert beyond["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 11) / 3)
    assert beyond["cross_entropy"] == pytest.approx(2.0)
    with pytest.raises(ValueError):
        metrics_from_ranks([0, 1], [0.0, 0.0])


def test_recall_curve_is_the_recall_at_every_k():
    curve = recall_curve(np.array(EXPECTED_RANKS), max_k=6)
    assert curve["k"] == [1, 2, 3, 4, 5, 6]
    assert curve["values"] == pytest.approx([2 / 7, 2 / 7, 4 / 7, 6 / 7, 1.0, 1.0])


def test_popularity_ranks_by_count_ties_by_index_and_smooths_the_probability():
    counts = np.array([0, 0, 0, 5, 9, 5, 0, 1, 2])
    cases = case_ranks(PopularityModel(counts), EncodedOutfits(OUTFITS), batch_size=2, device="cpu")
    # Order: 4 (9), 3 (5), 5 (5), 8 (2), 7 (1), 6 (0); the same exclusions as above.
    assert cases["rank"].tolist() == [1, 4, 1, 3, 3, 4, 2]
    smoothed = counts[N_SPECIAL:] + 1
    expected = np.log(smoothed[np.array(EXPECTED_TARGETS) - N_SPECIAL] / smoothed.sum())
    np.testing.assert_allclose(cases["log_prob"], expected, rtol=1e-6)


def test_evaluation_json_of_a_run_and_of_the_baseline(tmp_path, monkeypatch):
    import contextual_bert.data.feature_store as features

    spec = ContextSpec((FeatureSpec("gender", "categorical", "customer", N_SPECIAL + 2, 4),))
    splits = {
        "test": EncodedOutfits(OUTFITS, {"gender": torch.tensor([3, 4, 3])}, ["o-a", "o-b", "o-c"]),
        "val": EncodedOutfits(OUTFITS[:2], {"gender": torch.tensor([4, 4])}),
    }

    class Vocab:
        counts = np.array([0, 0, 0, 5, 9, 5, 0, 1, 2])

        def __len__(self):
            return len(self.counts)

    monkeypatch.setattr(features, "load_split", lambda d, split, max_set_size, catalogue=False: splits[split])
    monkeypatch.setattr(features, "load_article_vocab", lambda d: Vocab())
    torch.manual_seed(0)
    bert = ContextualBert(ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=16), "global_state", 9, spec)
    save_checkpoint(tmp_path / "global_state-s0" / "checkpoint.pt", bert, {"seed": 0})
    cfg = EvaluateConfig(ks=[1, 5], batch_size=4, fitb={"enabled": False})  # FITB: test_fitb.py, test_products.py

    result = evaluate_run(tmp_path, tmp_path / "global_state-s0", tmp_path / "eval" / "global_state-s0.json", cfg)
    assert json.loads((tmp_path / "eval" / "global_state-s0.json").read_text()) == result
    assert (result["name"], result["model"], result["seed"]) == ("global_state-s0", "global_state", 0)
    assert result["parameters"] == count_paper_parameters(bert)
    keys = {"n_outfits", "n_cases", "n_unknown_targets", "cross_entropy", "recall@1", "recall@5", "mrr", "ndcg@10"}
    # a trained model's evaluation says how much its prediction depends on the outfit (outfit_dependence, on test)
    assert set(result["test"]) == keys | {"outfit_dependence"} and set(result["val"]) == keys
    assert math.isfinite(result["test"]["outfit_dependence"])
    assert (result["test"]["n_outfits"], result["test"]["n_cases"], result["test"]["n_unknown_targets"]) == (3, 7, 1)
    assert result["val"]["n_cases"] == 5
    assert result["recall_curve"]["k"] == list(range(1, 251)) and result["recall_curve"]["test"][-1] == 1.0
    low, high = result["test_bootstrap"]["recall@5"]  # over the 3 test outfits (bootstrap.py)
    assert low <= result["test"]["recall@5"] <= high and result["test_bootstrap"]["unit"] == "test outfits"

    baseline = evaluate_popularity(tmp_path, tmp_path / "eval" / "popularity.json", cfg)
    assert (baseline["model"], baseline["seed"], baseline["parameters"]) == ("popularity", None, 0)
    assert "outfit_dependence" not in baseline["test"]  # not a trained encoder: nothing to measure
    assert baseline["test"]["recall@1"] == pytest.approx(2 / 7)  # ranks from the popularity test above
    assert json.loads((tmp_path / "eval" / "popularity.json").read_text()) == baseline

    # Per test outfit: its id, its cases ([UNK] skipped) and sums whose totals give the test metrics; the run
    # and the baseline rank the same cases, so they pair (bootstrap.paired_difference).
    for evaluated in (result, baseline):
        record = evaluated["test_outfits"]
        assert record["outfit_id"] == ["o-a", "o-b", "o-c"] and record["cases"] == [3, 2, 2]
        for metric in ("cross_entropy", "recall@1", "recall@5"):
            total = sum(record["sums"][metric]) / sum(record["cases"])
            assert total == pytest.approx(evaluated["test"][metric], abs=1e-9), metric
    paired = paired_difference(result["test_outfits"], baseline["test_outfits"], "cross_entropy")
    assert paired["difference"] == pytest.approx(result["test"]["cross_entropy"] - baseline["test"]["cross_entropy"])
    assert paired["interval"][0] <= paired["difference"] <= paired["interval"][1]
    text = (tmp_path / "eval" / "global_state-s0.json").read_text()
    assert '"cases": [3, 2, 2]' in text  # a line per list, not a line per outfit

    # the run's own evaluation says where it stands against its yardstick: the baseline stage's popularity,
    # computed again on the same test cases (the evaluation reads nothing but the features)
    verdict = result["yardstick"]
    assert verdict["name"] == "popularity" and verdict["rule"] == "paired bootstrap"  # no history in its context
    assert verdict["yardstick"] == baseline["test"]["cross_entropy"]
    assert verdict["difference"] == pytest.approx(paired["difference"]) and verdict["interval"] == paired["interval"]
    assert verdict["verdict"] in ("better", "level", "worse")

    monkeypatch.setattr(features, "load_article_vocab", lambda d: [0] * 12)
    with pytest.raises(Exception, match="features changed"):
        evaluate_run(tmp_path, tmp_path / "global_state-s0", tmp_path / "x.json", cfg)


def test_a_run_trained_without_a_checkpoint_points_at_the_validation_split(tmp_path):
    from contextual_bert.errors import ContextualBertError

    run = tmp_path / "none-s0"
    run.mkdir()
    (run / "curve.json").write_text(json.dumps([{"epoch": 1, "val_cross_entropy": float("inf")}]))
    with pytest.raises(ContextualBertError, match=r"trained .* but no checkpoint was kept.*validation split") as info:
        evaluate_run(tmp_path, run, tmp_path / "x.json", EvaluateConfig())
    assert "train this run first" not in str(info.value)
    with pytest.raises(ContextualBertError, match="train this run first"):  # never trained: that is the advice
        evaluate_run(tmp_path, tmp_path / "concat-s0", tmp_path / "x.json", EvaluateConfig())


# --- the attribute-aware popularity and the catalogue rankers (issue 14) ---------------------------------


def _attribute_popularity(r: float):
    from contextual_bert.evaluation.counts import AttributePopularityModel

    # articles 3..8 have ids (train counts), 9..10 none; attribute values 3 ("top") and 4 ("shoes")
    values = np.array([0, 0, 0, 3, 3, 3, 4, 4, 4, 3, 4])
    counts = np.array([0, 0, 0, 10, 5, 1, 8, 4, 1, 0, 0])
    return AttributePopularityModel(values, counts, n_ids=9, in_outfit_share=r)


def test_attribute_popularity_is_a_distribution_that_prefers_values_not_in_the_outfit():
    items = torch.tensor([[3, MASK_INDEX, 0, 0], [MASK_INDEX, 0, 0, 0]])  # a top in the first outfit
    for r in (0.0, 0.3):
        logits = _attribute_popularity(r).masked_logits(items)
        assert torch.isinf(logits[:, :N_SPECIAL]).all()
        probs = logits[:, N_SPECIAL:].exp()
        torch.testing.assert_close(probs.sum(dim=1), torch.ones(2))  # over the whole catalogue
        tops = [a - N_SPECIAL for a in (3, 4, 5, 9)]
        assert abs(float(probs[0, tops].sum()) - max(r, 1e-6)) < 1e-5  # the values already in it share r
        assert torch.isfinite(logits[:, 9:]).all()  # unseen articles: ranked, by their value's popularity
    # with no value in the outfit: popularity of the value, then within it (unseen: a Good-Turing share)
    logits = _attribute_popularity(0.0).masked_logits(items)[1]
    assert logits[3] > logits[4] > logits[5] and logits[9] < logits[4]


def test_attribute_popularity_lifted_by_history_is_popularity_plus_own_history_for_one_value():
    """With one attribute value and every article an id, the attribute-aware popularity is the popularity of the
    counts (without the + 1): lifted by the history it is popularity + own history at the same weight; and its
    history's articles of a value already in the outfit are lifted from that value's small share."""
    from contextual_bert.evaluation.counts import (
        AttributeHistoryPopularityModel,
        AttributePopularityModel,
        HistoryPopularityModel,
    )

    counts = np.array([0, 0, 0, 6, 3, 2, 2, 1, 4])  # every article at least once: P_attr(a) = count / sum
    one_value = AttributePopularityModel(np.array([0, 0, 0] + [1] * 6), counts, n_ids=9, in_outfit_share=0.5)
    items = torch.tensor([[3, MASK_INDEX, 0], [MASK_INDEX, 4, 5], [MASK_INDEX, 0, 0]])
    history = torch.tensor([[4, 4, 7, 0], [3, 8, 8, 8], [0, 0, 0, 0]])  # the last: no history
    for weight in (0.0, 0.3):
        lifted = AttributeHistoryPopularityModel(one_value, counts - 1, weight).masked_logits(
            items, {HISTORY_FEATURE: history}
        )
        expected = HistoryPopularityModel(counts - 1, weight).masked_logits(items, {HISTORY_FEATURE: history})
        torch.testing.assert_close(torch.log_softmax(lifted, dim=1), expected, atol=1e-5, rtol=0, equal_nan=False)
    # a top in the outfit (r = 0: no second top): the history's shoes (6) are lifted, its top
    # (4) by the same factor from its value's floored share, so it stays out of reach
    typed = AttributeHistoryPopularityModel(_attribute_popularity(0.0), np.array([0, 0, 0, 10, 5, 1, 8, 4, 1]), 0.3)
    outfit, worn = torch.tensor([[3, MASK_INDEX]]), {HISTORY_FEATURE: torch.tensor([[4, 6]])}
    lifted = torch.log_softmax(typed.masked_logits(outfit, worn), dim=1)[0]
    base = _attribute_popularity(0.0).masked_logits(outfit)[0]
    assert lifted[6] > base[6] + 0.1 and lifted[4] < -10 and lifted[7] < base[7]


def test_in_outfit_share_counts_cases_whose_value_another_item_has():
    from contextual_bert.evaluation.counts import in_outfit_share

    values = np.array([0, 0, 0, 3, 3, 4, 4])
    items = torch.tensor([[3, 4, 5, 0], [3, 5, 0, 0]])  # 3 and 4 share a value: 2 of 5 cases
    assert in_outfit_share(items, values) == pytest.approx(2 / 5)


def test_donor_outfits_pair_each_outfit_with_another_of_its_length():
    items = torch.tensor([[3, 4, 0], [5, 6, 0], [7, 8, 3], [4, 5, 0], [6, 7, 8]])
    donor = donor_outfits(items)
    lengths = (items != PAD_INDEX).sum(1)
    assert (lengths[donor] == lengths).all() and (donor != torch.arange(5)).all()
    assert sorted(donor.tolist()) == list(range(5))  # a permutation
    assert torch.equal(donor_outfits(items[:1]), torch.tensor([0]))  # alone of its length: itself


class _Copier(torch.nn.Module):
    """Predicts the article after the first other item of the outfit (index + 1), with `offset` (per outfit
    article) standing for AttributeOverlap's offsets; `reads_outfit` False: a constant scorer."""

    def __init__(self, n_items, reads_outfit, offsets=False):
        super().__init__()
        self.n_items, self.reads_outfit, self.offsets = n_items, reads_outfit, offsets

    def head(self, h):
        return h

    def outfit_offsets(self, items, select, articles=None, context=None, blocks=False):
        if not self.offsets:
            return None
        out = torch.zeros(int(select.sum()), self.n_items)
        first = items[:, 0]
        out[torch.arange(len(first)), (first % (self.n_items - N_SPECIAL)) + N_SPECIAL] = 3.0
        return out

    def masked_logits(self, items, context=None, offsets=None):
        logits = torch.zeros(items.shape[0], self.n_items)
        if self.reads_outfit:
            other = torch.where(items == MASK_INDEX, PAD_INDEX, items).amax(dim=1)
            nxt = (other + 1 - N_SPECIAL) % (self.n_items - N_SPECIAL) + N_SPECIAL
            logits[torch.arange(len(items)), nxt] = 5.0
        off = self.outfit_offsets(items, items == MASK_INDEX) if offsets is None else offsets
        return logits if off is None else logits + off


def test_outfit_dependence_is_zero_for_a_model_that_ignores_the_outfit_and_large_for_one_that_reads_it():
    # outfits of pairs (a, a + 1): the masked second article is the first's successor
    first = torch.arange(N_SPECIAL, N_SPECIAL + 40, 2)
    items = torch.stack([first, first + 1], dim=1)
    data = EncodedOutfits(items)
    n_items = N_SPECIAL + 41
    reader = case_ranks(_Copier(n_items, True), data, 7, "cpu", dependence=True)
    constant = case_ranks(_Copier(n_items, False), data, 7, "cpu", dependence=True)
    assert outfit_dependence(constant["log_prob"], constant["log_prob_shuffled"]) == pytest.approx(0.0, abs=1e-9)
    assert outfit_dependence(reader["log_prob"], reader["log_prob_shuffled"]) > 1.0
    # the attribute-overlap offsets stay those of the real outfit: a model whose outfit dependence is all in
    # its offsets (the hand-built rule) shows none
    offsets_only = case_ranks(_Copier(n_items, False, offsets=True), data, 7, "cpu", dependence=True)
    assert outfit_dependence(offsets_only["log_prob"], offsets_only["log_prob_shuffled"]) == pytest.approx(
        0.0, abs=1e-6
    )
    assert measures_dependence(_Copier(n_items, True)) and not measures_dependence(PopularityModel([1] * n_items))


def test_the_verdict_against_a_yardstick_is_better_level_or_worse_by_the_se_or_the_interval():
    # a difference is model minus yardstick cross-entropy: negative is better
    assert verdict_of(-0.30, margin=0.05) == "better" and verdict_of(0.30, margin=0.05) == "worse"
    assert verdict_of(0.03, margin=0.05) == "level" == verdict_of(-0.05, margin=0.05)
    assert verdict_of(0.1, interval=[0.02, 0.2]) == "worse" and verdict_of(-0.1, interval=[-0.2, -0.01]) == "better"
    assert verdict_of(0.01, interval=[-0.02, 0.05]) == "level"
