"""Fill-in-the-blank (fitb.py): the questions (never an item of the outfit, the same for the same seed, hard
negatives of the blank's value) and the answers (an oracle gets 1, a scorer that ignores its input 1/N)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from contextual_bert.config import FitbConfig
from contextual_bert.data.feature_spec import MISSING_INDEX, N_SPECIAL, PAD_INDEX, EncodedOutfits
from contextual_bert.evaluation.fitb import Questions, fitb_result, make_questions, write_questions

N_ARTICLES = 200  # catalogue rows, specials included
N_TYPES = 6


def outfits(n: int = 120, seed: int = 0) -> np.ndarray:
    """(n, 8) catalogue indices, 3-8 distinct real articles per outfit, PAD-padded."""
    rng = np.random.default_rng(seed)
    items = np.full((n, 8), PAD_INDEX, dtype=np.int64)
    for row in range(n):
        size = rng.integers(3, 9)
        items[row, :size] = rng.choice(np.arange(N_SPECIAL, N_ARTICLES), size, replace=False)
    return items


def types() -> np.ndarray:
    values = N_SPECIAL + np.arange(N_ARTICLES) % N_TYPES
    values[:N_SPECIAL] = PAD_INDEX
    values[N_SPECIAL + 5] = MISSING_INDEX  # an article whose type is missing: no hard question for it
    return values


def questions(seed: int = 0, items=None) -> Questions:
    items = outfits() if items is None else items
    return make_questions(items, N_ARTICLES, FitbConfig(seed=seed), {"product_type": types()})


class Scorer(torch.nn.Module):
    """masked_logits from a function of (items with the [MASK], the blank's true article)."""

    def __init__(self, score, truth: np.ndarray):
        super().__init__()
        self.score, self.truth, self.n_items = score, truth, N_ARTICLES

    def masked_logits(self, items, context=None):
        return self.score(items)


def answered(model, items: np.ndarray, qs: Questions) -> tuple[dict, dict]:
    data = EncodedOutfits(torch.from_numpy(items))
    return fitb_result(model, data, qs, FitbConfig(), batch_size=64, device="cpu")


def test_candidates_never_include_an_item_of_the_outfit():
    items = outfits()
    qs = questions(items=items)
    for protocol in ("easy", "hard"):
        asked = qs.asked[protocol]
        assert asked.sum() > 0.9 * len(asked), protocol
        for q in np.flatnonzero(asked):
            candidates = qs.candidates[protocol][q]
            blank = items[qs.outfit[q], qs.position[q]]
            assert candidates[qs.answer[protocol][q]] == blank
            negatives = np.delete(candidates, qs.answer[protocol][q])
            assert len(set(negatives.tolist())) == 3 and (negatives >= N_SPECIAL).all()
            assert not set(negatives.tolist()) & set(items[qs.outfit[q]].tolist()), (protocol, q)


def test_hard_negatives_share_the_blanks_type_and_a_missing_type_is_not_asked():
    items, values = outfits(), types()
    qs = questions(items=items)
    asked = qs.asked["hard"]
    blanks = items[qs.outfit, qs.position]
    assert (values[qs.candidates["hard"][asked]] == values[blanks[asked], None]).all()
    assert not asked[values[blanks] == MISSING_INDEX].any()
    assert qs.hard_attribute == "product_type"


def test_questions_are_identical_across_runs_with_the_same_seed(tmp_path):
    first, again, other = questions(0), questions(0), questions(1)
    assert first.digest() == again.digest() and first.digest() != other.digest()
    for protocol in ("easy", "hard"):
        np.testing.assert_array_equal(first.candidates[protocol], again.candidates[protocol])
    ids = [f"a{i}" for i in range(N_ARTICLES)]
    outfit_ids = [f"o{i}" for i in range(120)]
    write_questions(first, outfit_ids, ids, tmp_path / "one.csv")
    write_questions(again, outfit_ids, ids, tmp_path / "two.csv")
    assert (tmp_path / "one.csv").read_bytes() == (tmp_path / "two.csv").read_bytes()


def test_a_model_that_scores_the_true_item_highest_gets_accuracy_1():
    items = outfits()
    qs = questions(items=items)
    blank_of = {}  # a masked outfit (its items, the [MASK] in place of the blank) -> the blank
    for q in range(len(qs.outfit)):
        masked = items[qs.outfit[q]].copy()
        with_mask = np.where(np.arange(8) == qs.position[q], 1, masked)  # 1: MASK_INDEX
        blank_of[tuple(with_mask[masked != PAD_INDEX])] = masked[qs.position[q]]

    def oracle(masked):
        scores = torch.zeros(masked.shape[0], N_ARTICLES)
        for row, outfit in enumerate(masked.tolist()):
            scores[row, blank_of[tuple(a for a in outfit if a != PAD_INDEX)]] = 1.0
        return scores

    metrics, block = answered(Scorer(oracle, items), items, qs)
    assert metrics == {"fitb_easy": 1.0, "fitb_hard": 1.0}
    assert block["easy"]["ci"] == [1.0, 1.0]


@pytest.mark.parametrize("kind", ["constant", "random"])
def test_a_scorer_that_ignores_its_input_lands_at_one_in_n(kind):
    items = outfits(400)
    qs = questions(items=items)
    generator = torch.Generator().manual_seed(0)
    score = (lambda m: torch.zeros(m.shape[0], N_ARTICLES)) if kind == "constant" else \
        (lambda m: torch.rand(m.shape[0], N_ARTICLES, generator=generator))  # fmt: skip
    metrics, block = answered(Scorer(score, items), items, qs)
    for protocol in ("easy", "hard"):
        low, high = block[protocol]["ci"]
        assert low <= 0.25 <= high, (protocol, block[protocol])
        assert high - low < 0.1  # an interval that says something
        if kind == "constant":  # every candidate tied: 1/4 each, exactly
            assert metrics[f"fitb_{protocol}"] == pytest.approx(0.25)


def test_without_a_hard_attribute_hard_is_not_known():
    qs = make_questions(outfits(), N_ARTICLES, FitbConfig(), None)
    _, block = answered(Scorer(lambda m: torch.zeros(m.shape[0], N_ARTICLES), None), outfits(), qs)
    assert block["hard"]["known"] is False and "features.article_features is off" in block["hard"]["why"]
    assert not qs.asked["hard"].any() and qs.asked["easy"].all()


def test_a_candidate_outside_an_ids_only_models_vocabulary_scores_as_unknown():
    items = outfits()
    qs = questions(items=items)

    class IdsOnly(Scorer):  # a vocabulary of 100 articles; [UNK] (index 2) scores highest
        def masked_logits(self, masked, context=None):
            scores = torch.zeros(masked.shape[0], 100)
            scores[:, 2] = 1.0
            return scores

    model = IdsOnly(None, items)
    model.n_items = 100
    metrics, _ = answered(model, np.where(items >= 100, 2, items), qs)
    blank = items[qs.outfit, qs.position]
    unseen = qs.candidates["easy"] >= 100
    top = unseen.sum(axis=1)
    expected = np.where(blank >= 100, 1.0 / np.maximum(top, 1), 0.0)  # the blank wins only as one of the [UNK]s
    expected = np.where(top == 0, 0.25, expected)  # no unseen candidate: all tied at 0
    assert metrics["fitb_easy"] == pytest.approx(expected.mean())


def test_table1_has_fitb_easy_and_hard_for_every_row_popularity_included(tmp_path):
    import json

    from test_report import write_fake_runs

    from contextual_bert.evaluation.report import build_report

    cfg = write_fake_runs(tmp_path, seeds=(0, 1), models=("none", "global_state"))
    evals = tmp_path / "reports" / "eval"
    for number, path in enumerate(sorted(evals.glob("*.json"))):
        result = json.loads(path.read_text())
        easy, hard = 0.5 + number / 100, 0.3 + number / 100
        result["test"] |= {"fitb_easy": easy, "fitb_hard": hard}
        result["fitb"] = {
            "easy": {"accuracy": easy, "ci": [easy - 0.05, easy + 0.05]},
            "hard": {"accuracy": hard, "ci": [hard - 0.04, hard + 0.04]},
        }
        path.write_text(json.dumps(result))
    build_report(cfg)
    table = (tmp_path / "reports" / "table1.md").read_text()
    assert "| FITB easy % [95% CI] | FITB hard % [95% CI] |" in table
    rows = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| ")}
    popularity = json.loads((evals / "popularity.json").read_text())["fitb"]
    easy = popularity["easy"]["accuracy"] * 100
    assert f"| {easy:.1f} [{easy - 5:.2f}–{easy + 5:.2f}] |" in rows["| Popularity"]
    for name in ("| [None]", "| [GS]"):
        cells = rows[name].split(" | ")
        # easy and hard: mean ± SE [CI]
        assert sum(" ± " in c and "[" in c and "–" in c for c in cells) == 2, rows[name]


def test_a_hard_attribute_missing_everywhere_is_passed_over_and_no_hard_question_is_not_an_error():
    missing = np.full(N_ARTICLES, MISSING_INDEX)
    missing[:N_SPECIAL] = PAD_INDEX
    qs = make_questions(
        outfits(),
        N_ARTICLES,
        FitbConfig(hard_attributes=["product_type", "category"]),
        {"product_type": missing, "category": types()},
    )
    assert qs.hard_attribute == "category"  # product_type is declared but has no value
    rare = N_SPECIAL + np.arange(N_ARTICLES)  # every article its own value: no hard negatives
    rare[:N_SPECIAL] = PAD_INDEX
    qs = make_questions(outfits(), N_ARTICLES, FitbConfig(), {"product_type": rare})
    _, block = answered(Scorer(lambda m: torch.zeros(m.shape[0], N_ARTICLES), None), outfits(), qs)
    assert block["hard"]["known"] is False
    assert "no test blank has 3 articles of its product_type" in block["hard"]["why"]
    assert block["easy"]["n_questions"] == len(qs.outfit)
