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
from contextual_bert.feature_spec import MASK_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX
from contextual_bert.optimum import (
    RESULTS,
    build_optimum,
    elementary_symmetric_excluding,
    evaluate_optimum,
    optimum_from_features,
)
from contextual_bert.planted import PlantedTruth

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


@pytest.fixture(scope="module")
def planted_project(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    params = root / "params.yaml"
    paths = {k: str(root / v) for k, v in (("raw_dir", "data/raw"), ("validated_dir", "data/validated"),
             ("quarantine_dir", "data/quarantine"), ("features_dir", "data/features"), ("models_dir", "models"),
             ("reports_dir", "reports"))}  # fmt: skip
    params.write_text(yaml.safe_dump({
        "paths": paths,
        "ingest": {"source": "planted"},
        "planted": {"n_outfits": 5000, "n_articles": 600, "n_customers": 800, "n_types": 12, "n_tastes": 32},
        "features": {"default_dim": 8, "embedding_dims": {}, "val_fraction": 0.1, "test_fraction": 0.1},
    }))  # fmt: skip
    for stage in ("ingest", "validate", "features", "baseline", "optimum"):
        assert main(["--params", str(params), stage]) == 0, stage
    return root, params


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
    from contextual_bert.feature_store import load_split

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
