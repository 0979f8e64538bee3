"""The Bayes-optimal predictor of planted data: against hand-computed cases, and through the pipeline's stages."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
import yaml

from contextual_bert.cli import main
from contextual_bert.config import EvaluateConfig
from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX
from contextual_bert.data.planted.optimum import (
    OUTFIT_ROW,
    build_optimum,
    elementary_symmetric_excluding,
    history_log_prior,
)
from contextual_bert.data.planted.tastes import PlantedTruth
from contextual_bert.evaluation.optimum import (
    HISTORY_RESULT,
    RESULTS,
    evaluate_optimum,
    history_optimum_data,
    optimum_from_features,
)

# The hand-computed case: 3 types (a0 a1 | a2 a3 | a4 a5), 2 tastes, 2 customers.
W = np.array([[1, 3], [3, 1], [2, 1], [2, 3], [1, 4], [1, 1]], dtype=float)  # w[a, z]
# shares S[a, z] = w / W[type]: z0: .25 .75 | .5 .5 | .5 .5    z1: .75 .25 | .25 .75 | .8 .2
TASTE = np.array([[0.8, 0.2], [0.4, 0.6]])  # P(z | customer); the population mean is [0.6, 0.4]
TRUTH = PlantedTruth(
    article_ids=np.array(["a0", "a1", "a2", "a3", "a4", "a5"]), article_type=np.array([0, 0, 1, 1, 2, 2]),
    log_weight=np.log(W), customer_ids=np.array(["c0", "c1"]), taste_prob=TASTE, n_types=3,
)  # fmt: skip
SPECIALS = ["[PAD]", "[MASK]", "[UNK]"]


def _optimum(vocab, with_context, customer_digits=((0,), (1,))):
    return build_optimum(TRUTH, SPECIALS + vocab, with_context, customer_digits=np.array(customer_digits),
                         context_digits=[("who", 1)], radix=[2])  # fmt: skip


def _probs(model, items, who):
    logits = model.masked_logits(torch.tensor([items]), {"who": torch.tensor([who])})
    return dict(enumerate(torch.exp(logits[0]).tolist()))


def test_the_posterior_against_a_hand_computed_case():
    vocab = ["a3", "a0", "a5", "a1", "a2", "a4"]  # any order: indices are mapped back to the truth's rows
    idx = {a: N_SPECIAL + i for i, a in enumerate(vocab)}
    items = [idx["a1"], MASK_INDEX, PAD_INDEX]
    # Customer c0, other item a1: P(z | a1, c0) ~ (.8 * .75, .2 * .25) = (12/13, 1/13); types 1 and 2 are
    # free (1/2 each), so P(a) = 1/2 * (12/13 S[a, z0] + 1/13 S[a, z1]).
    p = _probs(_optimum(vocab, True), items, 0)
    expected = {"a2": 6.25 / 26, "a3": 6.75 / 26, "a4": 6.8 / 26, "a5": 6.2 / 26, "a0": 0.0, "a1": 0.0}
    for article, value in expected.items():
        assert p[idx[article]] == pytest.approx(value, abs=1e-12), article
    assert p[PAD_INDEX] == p[MASK_INDEX] == p[UNKNOWN_INDEX] == 0.0
    # Without context the prior is the population's (.6, .4): P(z | a1) = (9/11, 2/11).
    p = _probs(_optimum(vocab, False), items, 0)
    assert p[idx["a4"]] == pytest.approx(0.5 * (9 / 11 * 0.5 + 2 / 11 * 0.8), abs=1e-12)
    assert p[idx["a2"]] == pytest.approx(0.5 * (9 / 11 * 0.5 + 2 / 11 * 0.25), abs=1e-12)
    # Customer c1 (.4, .6): P(z | a1, c1) ~ (.3, .15) = (2/3, 1/3).
    p = _probs(_optimum(vocab, True), items, 1)
    assert p[idx["a3"]] == pytest.approx(0.5 * (2 / 3 * 0.5 + 1 / 3 * 0.75), abs=1e-12)


def test_an_unknown_item_is_an_article_outside_the_vocabulary():
    # a5 is not in the vocabulary: an [UNK] item of the outfit must be a5 (type 2), so the target is of
    # type 1 and P(z | a1, UNK, c0) ~ (.8 * .75 * .5, .2 * .25 * .2) = (.3, .01).
    vocab = ["a0", "a1", "a2", "a3", "a4"]
    idx = {a: N_SPECIAL + i for i, a in enumerate(vocab)}
    p = _probs(_optimum(vocab, True), [MASK_INDEX, UNKNOWN_INDEX, idx["a1"]], 0)
    assert p[idx["a2"]] == pytest.approx((0.3 * 0.5 + 0.01 * 0.25) / 0.31, abs=1e-12)
    assert p[idx["a3"]] == pytest.approx((0.3 * 0.5 + 0.01 * 0.75) / 0.31, abs=1e-12)
    assert p[idx["a4"]] == p[idx["a0"]] == 0.0
    # without the [UNK] item, a4 is possible again
    assert _probs(_optimum(vocab, True), [MASK_INDEX, idx["a1"]], 0)[idx["a4"]] > 0.2


def test_customers_that_encode_alike_share_their_mean_prior():
    # both customers encoded to the same index (e.g. both [UNK]): the prior is their mean (.6, .4)
    pooled = _optimum(["a0", "a1", "a2", "a3", "a4", "a5"], True, customer_digits=((1,), (1,)))
    blind = _optimum(["a0", "a1", "a2", "a3", "a4", "a5"], False)
    items = torch.tensor([[N_SPECIAL + 1, MASK_INDEX, N_SPECIAL + 3]])
    assert torch.allclose(pooled.masked_logits(items, {"who": torch.tensor([1])}), blind.masked_logits(items))
    with pytest.raises(Exception, match="absent from the planted customer population"):
        pooled.masked_logits(items, {"who": torch.tensor([0])})


def test_elementary_symmetric_excluding_matches_brute_force():
    rng = np.random.default_rng(0)
    values = rng.random((2, 3, 6))
    got = elementary_symmetric_excluding(torch.tensor(values), 3).numpy()
    for i, j, t, degree in itertools.product(range(2), range(3), range(6), range(4)):
        rest = np.delete(values[i, j], t)
        brute = sum(np.prod(c) for c in itertools.combinations(rest, degree)) if degree else 1.0
        assert got[i, j, t, degree] == pytest.approx(brute, rel=1e-12)


# --- through the stages, on a small planted set ------------------------------------------------------


def planted_stages(root, planted: dict, features: dict, stages, **more) -> None:
    """A planted project in `root` (its params.yaml) through `stages`."""
    params = root / "params.yaml"
    paths = {k: str(root / v) for k, v in (("raw_dir", "data/raw"), ("validated_dir", "data/validated"),
             ("quarantine_dir", "data/quarantine"), ("features_dir", "data/features"), ("models_dir", "models"),
             ("reports_dir", "reports"))}  # fmt: skip
    params.write_text(yaml.safe_dump({
        "paths": paths, "ingest": {"source": "planted"}, "planted": planted,
        "features": {"default_dim": 8, "embedding_dims": {}, "val_fraction": 0.1, "test_fraction": 0.1, **features},
        **more}))  # fmt: skip
    for stage in stages:
        assert main(["--params", str(params), stage]) == 0, stage


@pytest.fixture(scope="module")
def planted_project(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    planted_stages(
        root,
        {"n_outfits": 5000, "n_articles": 600, "n_customers": 800, "n_types": 12, "n_tastes": 32},
        {},
        ("ingest", "validate", "features", "baseline", "optimum"),
    )
    return root, root / "params.yaml"


def test_the_optimum_stage_beats_popularity_and_context_helps(planted_project):
    root, _ = planted_project
    read = lambda name: json.loads((root / "reports" / "eval" / f"{name}.json").read_text())  # noqa: E731
    popularity, context, blind = read("popularity"), read("optimum_context"), read("optimum_no_context")
    assert context["known"] and blind["known"]
    assert set(context) >= set(popularity) and set(context["test"]) == set(popularity["test"])
    assert context["test"]["n_cases"] == blind["test"]["n_cases"] == popularity["test"]["n_cases"] > 1000
    ce = {name: r["test"]["cross_entropy"] for name, r in (("pop", popularity), ("ctx", context), ("no", blind))}
    assert ce["ctx"] < ce["no"] - 0.05 and ce["no"] < ce["pop"] - 0.3, ce
    assert context["test"]["recall@5"] > blind["test"]["recall@5"] > popularity["test"]["recall@5"]


def test_the_optimum_sums_to_one_over_the_vocabulary(planted_project):
    from contextual_bert.data.feature_store import load_split

    root, _ = planted_project
    test = load_split(root / "data/features", "test", 8)
    items = test.items[:200].clone()
    items[:, 0] = MASK_INDEX
    for with_context in (True, False):
        model = optimum_from_features(root / "data/raw", root / "data/features", with_context)
        logits = model.masked_logits(items, {k: v[:200] for k, v in test.context.items()})
        assert logits.dtype == torch.float64
        assert torch.allclose(torch.exp(logits).sum(1), torch.ones(200, dtype=torch.float64), atol=1e-10)
        assert torch.isinf(logits[:, :N_SPECIAL]).all()
        in_outfit = logits.gather(1, items[:, 1:])[items[:, 1:] >= N_SPECIAL]  # the outfit's other articles
        assert len(in_outfit) > 300 and torch.isneginf(in_outfit).all()


def test_without_a_truth_the_stage_says_the_optimum_is_unknown(tmp_path):
    out = {name: tmp_path / f"{name}.json" for name in RESULTS}
    results = evaluate_optimum(tmp_path / "raw", tmp_path / "features", out, EvaluateConfig())
    for name, path in out.items():
        written = json.loads(path.read_text())
        assert written == results[name] and written["known"] is False and "no planted truth" in written["why"]


# --- with context and history (issue 40) ------------------------------------------------------------


@pytest.fixture(scope="module")
def history_project(tmp_path_factory):
    """Planted data whose customers have a hidden taste and many outfits each (400 customers, 8 on average),
    with the history feature on, as a study of history runs it: the optimum reads the customer's columns only."""
    root = tmp_path_factory.mktemp("planted_history")
    planted_stages(
        root,
        {
            "n_outfits": 3200,
            "n_articles": 600,
            "n_customers": 400,
            "n_types": 12,
            "n_tastes": 32,
            "customer_taste_strength": 3.0,
        },
        {"history": {"enabled": True, "max_items": 20}},
        ("ingest", "validate", "features", "optimum"),
        evaluate={"fitb": {"enabled": False}},
    )
    return root


def test_the_optimum_with_history_is_at_most_the_one_with_context(history_project):
    read = lambda name: json.loads((history_project / "reports" / "eval" / f"{name}.json").read_text())  # noqa: E731
    context, history = read("optimum_context"), read(HISTORY_RESULT)
    assert history["known"] and history["split_rule"] == "hash"
    for split in ("test", "val"):
        assert history[split]["n_cases"] == context[split]["n_cases"] > 1000
        assert history[split]["cross_entropy"] < context[split]["cross_entropy"] - 0.005, split
        assert history["n_history_outfits"][split] > 0.5 * history[split]["n_outfits"]


def test_without_history_the_optimum_with_history_is_the_one_with_context(history_project):
    """A case whose outfit has no history (its customer's first outfit among the eligible ones) gets the
    context row's probabilities, and its prior is P(z | x_c) marginalised over the hidden taste."""
    import pandas as pd
    import pyarrow.parquet as pq

    from contextual_bert.data.contract import DATE_COLUMN
    from contextual_bert.data.feature_store import load_split
    from contextual_bert.data.history import earlier_outfits
    from contextual_bert.data.planted.tastes import load_truth

    raw, features = history_project / "data/raw", history_project / "data/features"
    model, rows, _ = history_optimum_data(raw, features)
    context_model = optimum_from_features(raw, features, with_context=True)
    outfits = pq.read_table(features / "outfits.parquet", columns=["outfit_id", "customer_id", "split"]).to_pandas()
    dates = pd.read_parquet(raw / "outfits.parquet").set_index("outfit_id").loc[outfits["outfit_id"], DATE_COLUMN]
    history = earlier_outfits(outfits["customer_id"].to_numpy(), dates.to_numpy(), outfits["split"] == "train")
    test = load_split(features, "test", 8)
    first = np.array([len(history[r]) == 0 for r in rows["test"]])
    assert 10 < first.sum() < len(first)
    truth = load_truth(raw)
    customer = pd.Index(truth.customer_ids).get_indexer(outfits["customer_id"].to_numpy()[rows["test"][first]])
    assert np.allclose(model.log_prior[rows["test"][first]].numpy(), np.log(truth.taste_prob[customer]), atol=1e-12)
    items = test.items.clone()
    items[:, 0] = MASK_INDEX
    context = {k: v for k, v in test.context.items()}
    with_history = model.masked_logits(items, {**context, OUTFIT_ROW: torch.from_numpy(rows["test"])})
    with_context = context_model.masked_logits(items, context)
    assert torch.allclose(with_history[first].exp(), with_context[first].exp(), atol=1e-10)
    assert not torch.allclose(with_history[~first].exp(), with_context[~first].exp(), atol=1e-6)


def test_history_log_prior_against_enumeration():
    """Two hidden tastes on the hand-computed truth: P(z | H, x) by brute force over u."""
    table = np.array([[1.0, -1.0], [-0.5, 0.5]])
    truth = PlantedTruth(**{**TRUTH.__dict__, "taste_logit": np.log(TASTE), "customer_taste_table": table})
    article_rows = [np.array([0, 2, 4]), np.array([1, 3]), np.array([1, 2, 5]), np.array([0, 3])]
    customer_rows = np.array([0, 0, 1, 0])
    history = [np.zeros(0, np.int64), np.array([0]), np.zeros(0, np.int64), np.array([1, 0])]
    got = np.exp(history_log_prior(truth, customer_rows, article_rows, history, np.array([1, 3, 0])))
    share = np.exp(truth.log_type_share())
    z_given_u = np.exp(truth.log_taste_given_u())  # (C, U, K)
    for row, o in enumerate([1, 3, 0]):
        c = customer_rows[o]
        p_u = np.array(
            [np.prod([z_given_u[c, u] @ np.prod(share[article_rows[h]], axis=0) for h in history[o]]) for u in range(2)]
        )
        expected = (p_u / p_u.sum()) @ z_given_u[c]
        assert got[row] == pytest.approx(expected, abs=1e-12), o
    assert got[2] == pytest.approx(z_given_u[0].mean(axis=0), abs=1e-12)  # no history: P(z | x), u uniform


def test_without_a_hidden_taste_the_history_row_is_absent(planted_project):
    root, _ = planted_project
    written = json.loads((root / "reports" / "eval" / f"{HISTORY_RESULT}.json").read_text())
    assert written["known"] is False and "customer_taste_strength 0" in written["why"]
