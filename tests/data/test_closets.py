"""Planted closets (data/planted/closets.py): the data, draws that follow the story, and its exact optimum (optimum.py)
against brute-force enumeration of the story on a tiny truth, and through the pipeline's stages."""

from __future__ import annotations

import itertools
import json
import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from contextual_bert.config import PlantedConfig
from contextual_bert.data.contract import DATE_COLUMN, TABLES, DataSchema
from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, UNKNOWN_INDEX
from contextual_bert.data.planted.closet_optimum import (
    ClosetHistoryOptimum,
    ClosetOptimum,
    build_closet_optimum,
    closet_history_log_prior,
)
from contextual_bert.data.planted.closets import CLOSET_CONTEXT_COLUMNS, ClosetTruth, _story, closet_schema
from contextual_bert.data.planted.optimum import OUTFIT_ROW
from contextual_bert.data.planted.tastes import TRUTH_JSON
from contextual_bert.data.sources.planted import generate as generate_planted
from contextual_bert.data.sources.planted import load_truth
from contextual_bert.evaluation.optimum import HISTORY_RESULT, optimum_from_features

SMALL = PlantedConfig(n_outfits=3000, n_articles=2000, n_customers=60, n_types=10, closet_size=12,
                      rewear_probability=0.4, seed=3)  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("closets")
    report = generate_planted(SMALL, out)
    return out, report, {name: pd.read_parquet(out / f"{name}.parquet") for name in TABLES}


def test_writes_the_contract_and_a_truth_no_column_reveals(data):
    out, report, tables = data
    assert DataSchema.load(out) == closet_schema() and report["story"] == "closets"
    assert report["rows"] == {"articles": 2000, "customers": 60, "outfits": 3000}
    articles, customers, outfits = tables["articles"], tables["customers"], tables["outfits"]
    # one categorical attribute; the contract's other article columns are null
    assert articles["product_type"].nunique() == 10
    assert articles[["brand", "color", "style", "price"]].isna().all().all()
    # the customers' columns are the context only, and a context is shared by many customers
    assert list(customers.columns) == ["customer_id"] + [name for name, _ in CLOSET_CONTEXT_COLUMNS]
    assert customers.groupby([name for name, _ in CLOSET_CONTEXT_COLUMNS]).size().max() > 1
    type_of = articles.set_index("article_id")["product_type"]
    sizes = outfits["article_ids"].map(len)
    assert set(sizes) == {4, 5, 6, 7, 8}
    assert (outfits["article_ids"].map(lambda ids: type_of[list(ids)].nunique()) == sizes).all()
    assert outfits[DATE_COLUMN].notna().all() and outfits[DATE_COLUMN].nunique() > 300
    truth = load_truth(out)
    assert isinstance(truth, ClosetTruth) and truth.closet.shape == (60, 12) and truth.rewear == 0.4
    assert list(truth.article_ids) == list(articles["article_id"])
    assert list(truth.customer_ids) == list(customers["customer_id"])
    about = json.loads((out / TRUTH_JSON).read_text())
    assert about["params"]["closet_size"] == 12 and 0.2 < about["signal"]["items_rewear_share"] < 0.4


def test_same_seed_same_data(data, tmp_path):
    out, _, tables = data
    generate_planted(SMALL, tmp_path)
    for name in TABLES:
        assert pd.read_parquet(tmp_path / f"{name}.parquet").equals(tables[name]), name
    assert (tmp_path / "planted_truth.npz").read_bytes() == (out / "planted_truth.npz").read_bytes()


def test_closets_and_tastes_are_one_story_or_the_other():
    with pytest.raises(ValueError, match="closets' story"):
        PlantedConfig(closet_size=10, customer_taste_strength=1.0)
    assert PlantedConfig().closet_size == 0  # off by default: today's planted data (test_planted.py's hash)


def test_the_draws_follow_the_emission():
    """Per customer and article, the items drawn vs e_c(a) times the customer's items of a's type."""
    cfg = PlantedConfig(n_outfits=40_000, n_articles=300, n_customers=8, n_types=10, closet_size=6,
                        rewear_probability=0.5, popularity_exponent=0.5, seed=4)  # fmt: skip
    s = _story(cfg, max_set_size=8, min_set_size=4)
    truth = ClosetTruth(np.arange(300).astype(str), s["article_type"], np.log(s["popularity"]),
                        np.arange(8).astype(str), s["closet"], 0.5, 10)  # fmt: skip
    customer = s["customer"][s["draw_outfit"]]
    observed = np.bincount(customer * 300 + s["article"], minlength=8 * 300).reshape(8, 300)
    per_type = np.bincount(customer * 10 + truth.article_type[s["article"]], minlength=80).reshape(8, 10)
    expected = per_type[:, truth.article_type] * truth.emission()
    assert np.allclose(truth.emission() @ (truth.article_type[:, None] == np.arange(10)), 1.0)
    assert (np.abs(observed - expected) < 5 * np.sqrt(expected) + 3).all()
    # re-wear: the share of items from the closet is rho times the share of draws whose type the closet holds
    holds = truth.slots_by_type()[customer, truth.article_type[s["article"]]] > 0
    assert s["rewear"][~holds].sum() == 0
    assert abs(s["rewear"][holds].mean() - 0.5) < 0.01
    # and a closet article is worn again and again by its owner
    in_closet = np.zeros((8, 300), bool)
    in_closet[np.repeat(np.arange(8), 6), truth.closet.ravel()] = True
    assert observed[in_closet].mean() > 10 * observed[~in_closet].mean()


def test_thirty_thousand_outfits_of_eighty_thousand_articles_in_under_a_minute(tmp_path):
    started = time.perf_counter()
    report = generate_planted(PlantedConfig(n_outfits=30_000, n_articles=80_000, n_customers=500, closet_size=40,
                                            popularity_exponent=0.5), tmp_path)  # fmt: skip
    assert time.perf_counter() - started < 60
    assert report["rows"]["outfits"] == 30_000 and report["planted_signal"]["drawn_articles_seen_at_most_twice"] > 0.5


# --- the optimum against brute force ------------------------------------------------------------------

# 4 types: a0 a1 | a2 a3 a4 | a5 a6 | a7 a8; three customers; c0's closet holds a2 twice
TYPES = np.array([0, 0, 1, 1, 1, 2, 2, 3, 3])
LOG_POP = np.log(np.array([3.0, 1.0, 2.0, 1.0, 0.5, 1.0, 2.0, 1.5, 1.0]))
CLOSET = np.array([[0, 2, 2], [3, 5, 7], [1, 4, 8]])
RHO = 0.4
TINY = ClosetTruth(np.array([f"a{i}" for i in range(9)]), TYPES, LOG_POP, np.array(["c0", "c1", "c2"]), CLOSET,
                   RHO, 4)  # fmt: skip
VOCAB = ["a3", "a0", "a1", "a2", "a4", "a5", "a7"]  # a6 and a8 (in c2's closet) are outside it
KEYS = np.array([0, 1, 0])  # c0 and c2 share a context
SPECIALS = ["[PAD]", "[MASK]", "[UNK]"]
IDX = {a: N_SPECIAL + i for i, a in enumerate(VOCAB)}


def story_emission() -> np.ndarray:
    """(C, A) e_c(a) straight from the story's words."""
    q = np.exp(LOG_POP) / np.bincount(TYPES, weights=np.exp(LOG_POP))[TYPES]
    out = np.zeros((3, 9))
    for c, a in itertools.product(range(3), range(9)):
        slots = [s for s in CLOSET[c] if TYPES[s] == TYPES[a]]
        rewear = RHO if slots else 0.0
        out[c, a] = (1 - rewear) * q[a] + rewear * (slots.count(a) / len(slots) if slots else 0.0)
    return out


def brute_force(observed: list, prior: np.ndarray) -> dict:
    """P(masked = a | observed) by enumerating every customer and every outfit of len(observed) articles of
    distinct types (every ordered type tuple equally likely): observed is per position an article name, "MASK"
    or "UNK" (an article outside the vocabulary); the masked article is known to be in the vocabulary."""
    e = story_emission()
    scores = {a: 0.0 for a in VOCAB}
    names = [f"a{i}" for i in range(9)]
    for c in range(3):
        for outfit in itertools.product(range(9), repeat=len(observed)):
            if len(set(TYPES[list(outfit)])) < len(outfit):
                continue
            ok = all(
                names[a] == o if o not in ("MASK", "UNK") else (names[a] not in VOCAB) == (o == "UNK")
                for a, o in zip(outfit, observed)
            )
            if ok:
                scores[names[outfit[observed.index("MASK")]]] += prior[c] * np.prod(e[c, list(outfit)])
    total = sum(scores.values())
    return {a: v / total for a, v in scores.items()}


CASES = [
    ["MASK", "a2", "a5"],
    ["a0", "MASK", "UNK"],
    ["MASK", "UNK", "UNK", "a3"],
    ["a7", "a1", "MASK"],
    ["MASK", "a4"],
    ["UNK", "MASK", "a5", "a2"],
]


def _encode(observed: list) -> list:
    return [MASK_INDEX if o == "MASK" else UNKNOWN_INDEX if o == "UNK" else IDX[o] for o in observed]


def _optimum_probs(model, observed, context) -> dict:
    logits = model.masked_logits(torch.tensor([_encode(observed)]), context)
    assert torch.exp(logits[0]).sum().item() == pytest.approx(1.0, abs=1e-12)
    return {a: torch.exp(logits[0, IDX[a]]).item() for a in VOCAB}


@pytest.mark.parametrize("observed", CASES)
def test_the_optimum_is_the_story_s_posterior(observed):
    blind = build_closet_optimum(TINY, np.array(SPECIALS + VOCAB, dtype=object), with_context=False)
    seen = build_closet_optimum(TINY, np.array(SPECIALS + VOCAB, dtype=object), True,
                                customer_digits=KEYS[:, None], context_digits=[("who", 1)], radix=[2])  # fmt: skip
    for model, prior, context in (
        (blind, np.full(3, 1 / 3), None),
        (seen, np.array([0.5, 0, 0.5]), {"who": torch.tensor([0])}),
        (seen, np.array([0.0, 1, 0]), {"who": torch.tensor([1])}),
    ):
        got, expected = _optimum_probs(model, observed, context), brute_force(observed, prior)
        for a in VOCAB:
            assert got[a] == pytest.approx(expected[a], abs=1e-12), (observed, a)


def test_a_small_chunk_gives_the_same_logits():
    model = build_closet_optimum(TINY, np.array(SPECIALS + VOCAB, dtype=object), with_context=False)
    items = torch.tensor([_encode(c + ["UNK"] * (4 - len(c))) if len(c) < 4 else _encode(c) for c in CASES])
    whole = model.masked_logits(items)
    model.chunk_cells = 1
    assert torch.equal(model.masked_logits(items), whole)
    assert isinstance(model, ClosetOptimum)


HISTORY_ARTICLES = [np.array([0, 2, 5]), np.array([2, 7]), np.array([3, 6, 1]), np.array([4, 8, 0]), np.array([5])]
HISTORY_CUSTOMER = np.array([0, 0, 1, 2, 0])
HISTORY = [np.zeros(0, np.int64), np.array([0]), np.zeros(0, np.int64), np.zeros(0, np.int64), np.array([1, 0])]


def test_history_prior_against_enumeration():
    e = story_emission()
    got = np.exp(closet_history_log_prior(TINY, KEYS, HISTORY_CUSTOMER, HISTORY_ARTICLES, HISTORY,
                                          np.array([1, 4, 3])))  # fmt: skip
    for row, o in enumerate([1, 4, 3]):
        group = KEYS == KEYS[HISTORY_CUSTOMER[o]]
        p = group * np.array([np.prod([np.prod(e[c, HISTORY_ARTICLES[h]]) for h in HISTORY[o]]) for c in range(3)])
        assert got[row] == pytest.approx(p / p.sum(), abs=1e-12), o
    assert got[2] == pytest.approx([0.5, 0.0, 0.5], abs=1e-15)  # no history: the context's group


@pytest.mark.parametrize("observed", CASES[:4])
def test_the_optimum_with_history_is_the_story_s_posterior(observed):
    log_prior = closet_history_log_prior(TINY, KEYS, HISTORY_CUSTOMER, HISTORY_ARTICLES, HISTORY, np.array([4, 1]))
    base = build_closet_optimum(TINY, np.array(SPECIALS + VOCAB, dtype=object), with_context=False)
    model = ClosetHistoryOptimum(
        base.item_type,
        base.fresh.log(),
        base.rewear,
        base.entry_customer,
        base.entry_item,
        base.entry_kappa,
        base.oov_share,
        log_prior,
        row_index=np.array([-1, 1, -1, -1, 0]),
    )
    for row, o in ((0, 4), (1, 1)):
        got = _optimum_probs(model, observed, {OUTFIT_ROW: torch.tensor([o])})
        expected = brute_force(observed, np.exp(log_prior[row]))
        for a in VOCAB:
            assert got[a] == pytest.approx(expected[a], abs=1e-12), (observed, o, a)


# --- through the stages -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def closets_project(tmp_path_factory):
    from test_optimum import planted_stages

    root = tmp_path_factory.mktemp("closets_project")
    planted_stages(
        root,
        {
            "n_outfits": 3000,
            "n_articles": 3000,
            "n_customers": 200,
            "n_types": 12,
            "closet_size": 20,
            "rewear_probability": 0.4,
            "popularity_exponent": 0.5,
        },
        {
            "split": "time",
            "history": {"enabled": True, "max_items": 50},
            "article_features": True,
            "article_attributes": {"planted": {"product_type": "categorical"}},
        },
        ("ingest", "validate", "features", "baseline", "optimum"),
        evaluate={"fitb": {"enabled": False}},
    )
    return root


def test_the_stages_give_every_yardstick_and_the_optimum_rows(closets_project):
    read = lambda name: json.loads((closets_project / "reports" / "eval" / f"{name}.json").read_text())  # noqa: E731
    ce = {name: read(name)["test"]["cross_entropy"] for name in ("popularity", "popularity_attribute",
          "popularity_history", "optimum_no_context", "optimum_context", HISTORY_RESULT)}  # fmt: skip
    assert all(read(name).get("known", True) for name in ce)
    assert read(HISTORY_RESULT)["split_rule"] == "time"
    n = read("optimum_context")["test"]["n_cases"]
    assert n == read(HISTORY_RESULT)["test"]["n_cases"] == read("popularity")["test"]["n_cases"] > 500
    # the context narrows the customers down, the history says whose closet it is (where the rest of the outfit
    # has not); the optimum beats every count
    assert ce[HISTORY_RESULT] < ce["optimum_context"] - 0.05 < ce["optimum_no_context"] - 0.1, ce
    assert ce["optimum_no_context"] < ce["popularity_attribute"] - 0.5 < ce["popularity"] - 0.5, ce
    assert ce[HISTORY_RESULT] < ce["popularity_history"] - 1.0, ce
    # the type rule and the customer's own articles together: on the known targets below either count alone
    known = {name: read(name)["test_known"]["cross_entropy"] for name in ("popularity_attribute",
             "popularity_attribute_history")}  # fmt: skip
    either = min(ce["popularity_history"], known["popularity_attribute"])
    assert known["popularity_attribute_history"] < either - 0.05, (known, ce)


def test_the_optimum_sums_to_one_and_gives_outfit_types_nothing(closets_project):
    from contextual_bert.data.feature_store import load_split

    raw, features = closets_project / "data/raw", closets_project / "data/features"
    test = load_split(features, "test", 8)
    items = test.items[:100].clone()
    items[:, 0] = MASK_INDEX
    assert (items == UNKNOWN_INDEX).any()  # articles unseen in training: [UNK] items are scored exactly
    for with_context in (True, False):
        model = optimum_from_features(raw, features, with_context)
        assert isinstance(model, ClosetOptimum)
        logits = model.masked_logits(items, {k: v[:100] for k, v in test.context.items()})
        assert torch.allclose(torch.exp(logits).sum(1), torch.ones(100, dtype=torch.float64), atol=1e-10)
        in_outfit = logits.gather(1, items[:, 1:])[items[:, 1:] >= N_SPECIAL]
        assert len(in_outfit) > 100 and torch.isneginf(in_outfit).all()


def test_the_raw_outfits_have_dates_for_the_time_split(closets_project):
    assert DATE_COLUMN in pq.read_schema(closets_project / "data/raw/outfits.parquet").names
    manifest = json.loads((closets_project / "data/features/manifest.json").read_text())
    assert manifest["split"]["method"] == "by date"


SPARSE_RECIPE = {"init_output": "counts", "rare_id_decay": 5.0}  # docs/training.md, "Sparse data"


@pytest.mark.parametrize("recipe, beats_the_count", [(SPARSE_RECIPE, True), ({}, False)])
def test_the_sparse_recipe_beats_the_count_on_tiny_closets(closets_project, tmp_path, recipe, beats_the_count):
    """[GS] with history and the sparse-data recipe (the output bias from the counts, the rare ids decayed) beats
    popularity + own history on validation by more than 0.02 nats within a few hundred steps (it learns how much
    an article worn once, twice, ... says: HistoryRepeat's v_k); params.yaml's recipe ends more than 0.03 behind
    the count."""
    from contextual_bert.config import load_config
    from contextual_bert.data.feature_store import load_split
    from contextual_bert.training import train

    read = lambda name: json.loads((closets_project / "reports" / "eval" / f"{name}.json").read_text())  # noqa: E731
    count = read("popularity_history")["val"]["cross_entropy"]
    repo = load_config()  # the repository's settings, on a small model
    cfg = repo.train.model_copy(update={"max_epochs": 6, "patience": 6, **recipe})
    model = repo.model.model_copy(update={"d_model": 32, "n_heads": 4, "d_ff": 64, "n_blocks": 2})
    features = closets_project / "data" / "features"
    assert len(load_split(features, "train", 8)) / cfg.batch_size * cfg.max_epochs < 400  # steps
    best = train(features, tmp_path / "gs", "global_state", 0, model, cfg)["best_val_cross_entropy"]
    assert best < count - 0.02 if beats_the_count else best > count + 0.03, (best, count)
