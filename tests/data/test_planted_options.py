"""The planted tastes' options (data/planted/tastes_options.py): the compatibility switch, the paper's context and
article vectors. Each off leaves the data as it was (test_planted.py's hash); each on changes only what it adds;
the switch's optimum against brute-force enumeration of the story; the noise columns change no optimum."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from pydantic import ValidationError
from test_optimum import planted_stages

from contextual_bert.config import PlantedConfig
from contextual_bert.data.contract import DATE_COLUMN, DataSchema
from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, UNKNOWN_INDEX
from contextual_bert.data.planted import tastes_options as options
from contextual_bert.data.planted.optimum import build_optimum, history_log_prior
from contextual_bert.data.planted.tastes import (
    TRUTH_FILE,
    TRUTH_JSON,
    PlantedTruth,
    _catalogue,
    _customers,
    _outfits,
    generate_planted,
    load_truth,
    planted_schema,
)
from contextual_bert.evaluation.optimum import optimum_from_features

REPO_PARAMS = yaml.safe_load(open(__file__.rsplit("/tests/", 1)[0] + "/params.yaml"))
SMALL = PlantedConfig(n_outfits=800, n_articles=300, n_customers=200, n_types=10, n_tastes=6, seed=3)
ON = {"compatibility_switch": 1.0, "n_lifestyles": 2}


def _tables(out) -> dict[str, pd.DataFrame]:
    return {name: pd.read_parquet(out / f"{name}.parquet") for name in ("articles", "customers", "outfits")}


def _npz(out) -> dict[str, np.ndarray]:
    with np.load(out / TRUTH_FILE) as z:
        return {key: z[key] for key in z.files}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    out = tmp_path_factory.mktemp("plain")
    generate_planted(SMALL, out)
    return out


def test_the_options_are_off_by_default_and_bad_settings_say_so():
    cfg = PlantedConfig()
    assert (cfg.compatibility_switch, cfg.context, cfg.vector_dim) == (0.0, "plain", 0)
    assert options.unused_settings(cfg) == {"compatibility_switch", "n_lifestyles", "context", "vector_dim",
                                            "vector_noise"}  # fmt: skip
    assert planted_schema(cfg) == planted_schema()
    for bad, match in (
        ({"compatibility_switch": 0.5, "n_lifestyles": 1}, "needs at least 2 lifestyles"),
        ({"compatibility_switch": 1.5}, "compatibility_switch"),
        ({"context": "papers"}, "context"),
        ({"vector_dim": -1}, "vector_dim"),
        ({"vector_noise": -0.1}, "vector_noise"),
        ({"closet_size": 8, "vector_dim": 4}, "the planted tastes' options"),
    ):
        with pytest.raises(ValidationError, match=match):
            PlantedConfig(**bad)


# --- each option on changes only what it adds -------------------------------------------------------------


def test_vectors_add_a_column_and_change_nothing_else(plain, tmp_path):
    generate_planted(SMALL.model_copy(update={"vector_dim": 6}), tmp_path)
    before, after = _tables(plain), _tables(tmp_path)
    assert after["articles"].drop(columns=[options.VECTOR_COLUMN]).equals(before["articles"])
    assert after["customers"].equals(before["customers"]) and after["outfits"].equals(before["outfits"])
    assert all(np.array_equal(v, _npz(plain)[k]) for k, v in _npz(tmp_path).items())
    field = pq.read_schema(tmp_path / "articles.parquet").field(options.VECTOR_COLUMN)
    assert str(field.type) == "list<element: float>"
    assert (after["articles"][options.VECTOR_COLUMN].map(len) == 6).all()
    about = json.loads((tmp_path / TRUTH_JSON).read_text())
    assert about["vectors"] == {"column": "style_vector", "dim": 6, "noise": 1.0}
    assert about["params"]["vector_dim"] == 6


def test_the_paper_context_adds_customer_columns_and_changes_nothing_else(plain, tmp_path):
    cfg = SMALL.model_copy(update={"context": "paper"})
    generate_planted(cfg, tmp_path)
    before, after = _tables(plain), _tables(tmp_path)
    paper = [c.name for c in options.paper_columns(cfg, {"brand": [], "color": [], "style": [], "product_type": []})]
    assert len(paper) == 12 and list(after["customers"].columns) == list(before["customers"].columns) + paper
    assert after["customers"][list(before["customers"].columns)].equals(before["customers"])
    assert after["articles"].equals(before["articles"]) and after["outfits"].equals(before["outfits"])
    npz, base = _npz(tmp_path), _npz(plain)
    assert list(npz.pop("ignored_context")) == paper and all(np.array_equal(v, base[k]) for k, v in npz.items())
    assert load_truth(tmp_path).ignored_context == tuple(paper)
    schema = DataSchema.load(tmp_path)
    kinds = {c.name: c.kind for c in schema.context_columns}
    assert {kinds[n] for n in paper} == {"categorical", "multi_categorical", "numeric"}
    # pure noise: the same values whatever the story's settings
    other = tmp_path / "other"
    generate_planted(cfg.model_copy(update={"context_strength": 1.0, "taste_strength": 0.3, **ON}), other)
    assert _tables(other)["customers"][paper].equals(after["customers"][paper])


def test_the_paper_context_has_about_the_paper_s_d_context():
    features = REPO_PARAMS["features"]
    cfg = PlantedConfig(context="paper")
    dims = {c.name: features["embedding_dims"].get(c.name, features["default_dim"])
            for c in planted_schema(cfg).context_columns}  # fmt: skip
    paper = {c.name for c in options.paper_columns(cfg, {"brand": [], "color": [], "style": [], "product_type": []})}
    assert sum(d for n, d in dims.items() if n in paper) == 736 - features["embedding_dims"]["occasion"]
    assert sum(dims.values()) == 768  # and the five planted columns, 16 each


def test_the_switch_adds_a_lifestyle_and_redraws_only_the_articles(plain, tmp_path):
    generate_planted(SMALL.model_copy(update=ON), tmp_path)
    before, after = _tables(plain), _tables(tmp_path)
    assert after["articles"].equals(before["articles"])
    assert after["customers"].drop(columns=[options.LIFESTYLE]).equals(before["customers"])
    assert set(after["customers"][options.LIFESTYLE]) == {"lifestyle_0", "lifestyle_1"}
    same = ["outfit_id", "customer_id", DATE_COLUMN]
    assert after["outfits"][same].equals(before["outfits"][same])
    assert (after["outfits"]["article_ids"].map(len) == before["outfits"]["article_ids"].map(len)).all()
    truth, base = load_truth(tmp_path), load_truth(plain)
    assert truth.n_lifestyles == 2 and truth.log_weight.shape == (300, 12) and truth.taste_prob.shape == (200, 12)
    lifestyle = pd.Series(truth.lifestyle).map(lambda v: f"lifestyle_{v}")
    assert (lifestyle == after["customers"][options.LIFESTYLE]).all()
    # P(v, z | x_c) = 1[v = v_c] P(z | x_c)
    joint = truth.taste_prob.reshape(200, 2, 6)
    assert np.allclose(joint.sum(1), base.taste_prob, atol=1e-15)
    assert (joint[np.arange(200), 1 - truth.lifestyle] == 0).all()


# --- the switch's draws follow its story ------------------------------------------------------------------


@pytest.fixture(scope="module")
def story():
    cfg = PlantedConfig(n_outfits=40_000, n_articles=200, n_customers=2000, n_types=10, n_tastes=3, seed=5,
                        context_strength=1.0, **ON)  # fmt: skip
    rng = np.random.default_rng(cfg.seed)
    cat = _catalogue(rng, cfg)
    cus = _customers(rng, cfg)
    switch = options.compatibility(cfg, cat)
    return cfg, cat, switch, _outfits(rng, cfg, cat, cus, 8, 4, switch)


def test_articles_follow_their_lifestyle_s_share_under_the_taste(story):
    cfg, cat, switch, out = story
    latent = (switch["lifestyle"][out["customer"]] * cfg.n_tastes + out["taste"])[out["draw_outfit"]]
    w = np.exp(switch["log_weight"])
    per_type = np.zeros((cfg.n_types, w.shape[1]))
    np.add.at(per_type, cat["type"], w)
    share = w / per_type[cat["type"]]  # P(a | t(a), v, z)
    drawn = {}
    for pair in range(w.shape[1]):
        drawn[pair] = np.bincount(out["article"][latent == pair], minlength=cfg.n_articles)
        n_of_type = np.bincount(cat["type"][out["article"][latent == pair]], minlength=cfg.n_types)
        expected = n_of_type[cat["type"]] * share[:, pair]
        assert (np.abs(drawn[pair] - expected) < 5 * np.sqrt(expected) + 2).all(), pair
    # one taste draws other articles in the other lifestyle: the switch changes what goes together
    for z in range(cfg.n_tastes):
        first, second = drawn[z] / drawn[z].sum(), drawn[cfg.n_tastes + z] / drawn[cfg.n_tastes + z].sum()
        assert 0.5 * np.abs(first - second).sum() > 0.2, z


def test_the_switch_s_strength_blends_the_style_tables(story):
    cfg, cat, switch, _ = story
    half = options.compatibility(cfg.model_copy(update={"compatibility_switch": 0.6}), cat)
    own = switch["tables"]  # s = 1: each lifestyle's own draw, the same draw at s = 0.6
    assert np.allclose(half["tables"], 0.8 * cat["style_affinity"][None] + 0.6 * own, atol=1e-12)
    assert np.array_equal(half["lifestyle"], switch["lifestyle"])


# --- the switch's optimum against brute force ---------------------------------------------------------------

# 3 types (a0 a1 | a2 a3 | a4 a5), 2 tastes, 2 lifestyles: under lifestyle 0 taste 0 takes a1 with a2,
# under lifestyle 1 with a3
W = np.array([  # w_v[a, z], column v * 2 + z
    [1, 3, 1, 3], [3, 1, 3, 1], [3, 1, 1, 3], [1, 3, 3, 1], [1, 4, 2, 1], [1, 1, 1, 2],
], dtype=float)  # fmt: skip
TYPES = np.array([0, 0, 1, 1, 2, 2])
TASTE = np.array([[0.8, 0.2], [0.4, 0.6], [0.3, 0.7], [0.6, 0.4]])  # P(z | x_c)
LIFESTYLE = np.array([0, 1, 0, 0])
DIGITS = np.array([[0, 0], [0, 1], [1, 0], [0, 0]])  # (region, lifestyle) as encoded: c0 and c3 alike
NAMES = [f"a{i}" for i in range(6)]
VOCAB = ["a3", "a0", "a1", "a2", "a4"]  # a5 is outside it
IDX = {a: N_SPECIAL + i for i, a in enumerate(VOCAB)}
SPECIALS = ["[PAD]", "[MASK]", "[UNK]"]


def _truth(**more) -> PlantedTruth:
    joint, logit, table = options.joint_taste(LIFESTYLE, 2, TASTE, more.pop("taste_logit", None),
                                              more.pop("customer_taste_table", None))  # fmt: skip
    hidden = {} if table is None else {"taste_logit": logit, "customer_taste_table": table}
    return PlantedTruth(np.array(NAMES), TYPES, np.log(W), np.array(["c0", "c1", "c2", "c3"]), joint, 3,
                        n_lifestyles=2, lifestyle=LIFESTYLE, **hidden)  # fmt: skip


def _share(v: int) -> np.ndarray:
    """(A, K) P(a | t(a), v, z) from the story's words."""
    w = W[:, 2 * v : 2 * v + 2]
    return w / np.stack([w[TYPES == t].sum(0) for t in range(3)])[TYPES]


def brute_force(observed: list, customers: list) -> dict:
    """P(masked = a | observed) enumerating the customers (uniform among `customers`), their taste and every
    outfit of distinct types: each observed position an article name, "MASK" or "UNK" (outside the vocabulary)."""
    scores = dict.fromkeys(VOCAB, 0.0)
    for c, z in itertools.product(customers, range(2)):
        share = _share(LIFESTYLE[c])[:, z]
        for outfit in itertools.product(range(6), repeat=len(observed)):
            if len(set(TYPES[list(outfit)])) < len(outfit):
                continue
            if all(NAMES[a] == o if o not in ("MASK", "UNK") else (NAMES[a] not in VOCAB) == (o == "UNK")
                   for a, o in zip(outfit, observed)):  # fmt: skip
                scores[NAMES[outfit[observed.index("MASK")]]] += TASTE[c, z] * np.prod(share[list(outfit)])
    total = sum(scores.values())
    return {a: v / total for a, v in scores.items()}


def _probs(model, observed, context=None) -> dict:
    items = [MASK_INDEX if o == "MASK" else UNKNOWN_INDEX if o == "UNK" else IDX[o] for o in observed]
    logits = model.masked_logits(torch.tensor([items]), context)
    assert torch.exp(logits[0]).sum().item() == pytest.approx(1.0, abs=1e-12)
    return {a: torch.exp(logits[0, IDX[a]]).item() for a in VOCAB}


@pytest.mark.parametrize("observed", [["MASK", "a1"], ["a1", "MASK", "a4"], ["MASK", "UNK", "a0"],
                                      ["a2", "UNK", "MASK"], ["MASK", "a3"]])  # fmt: skip
def test_the_switch_s_optimum_is_the_story_s_posterior(observed):
    vocab = np.array(SPECIALS + VOCAB, dtype=object)
    blind = build_optimum(_truth(), vocab, with_context=False)
    seen = build_optimum(_truth(), vocab, True, customer_digits=DIGITS, context_digits=[("region", 1),
                         ("lifestyle", 1)], radix=[2, 2])  # fmt: skip
    cases = [(blind, None, [0, 1, 2, 3])] + [
        (seen, {"region": torch.tensor([r]), "lifestyle": torch.tensor([v])}, customers)
        for (r, v), customers in (((0, 0), [0, 3]), ((0, 1), [1]), ((1, 0), [2]))
    ]
    for model, context, customers in cases:
        got, expected = _probs(model, observed, context), brute_force(observed, customers)
        for a in VOCAB:
            assert got[a] == pytest.approx(expected[a], abs=1e-12), (observed, customers, a)


def test_the_switch_s_history_prior_against_enumeration():
    """With the hidden per-customer taste: P(v, z | H, x) by brute force over u, the customer's lifestyle fixed."""
    logit, table = np.log(TASTE), np.array([[1.0, -1.0], [-0.5, 0.5]])
    truth = _truth(taste_logit=logit, customer_taste_table=table)
    article_rows = [np.array([0, 2, 4]), np.array([1, 3]), np.array([1, 2, 5]), np.array([0, 3]), np.array([1, 4])]
    customer_rows = np.array([0, 0, 1, 1, 0])  # a history is its customer's earlier outfits
    history = [np.zeros(0, np.int64), np.array([0]), np.zeros(0, np.int64), np.array([2]), np.array([1, 0])]
    wanted = [1, 3, 4, 0, 2]
    got = np.exp(history_log_prior(truth, customer_rows, article_rows, history, np.array(wanted)))
    for row, o in enumerate(wanted):
        c = customer_rows[o]
        v = LIFESTYLE[c]
        z_given_u = np.exp(logit[c] + table) / np.exp(logit[c] + table).sum(1, keepdims=True)  # (U, K)
        likelihood = [np.prod(_share(v)[article_rows[h]], axis=0) for h in history[o]]  # per h, (K,)
        p_u = np.array([np.prod([z_given_u[u] @ lh for lh in likelihood]) for u in range(2)])
        expected = np.zeros((2, 2))
        expected[v] = (p_u / p_u.sum()) @ z_given_u
        assert got[row] == pytest.approx(expected.reshape(-1), abs=1e-12), o


# --- article vectors ----------------------------------------------------------------------------------------


def _held_out_r2(vectors: np.ndarray, target: np.ndarray) -> float:
    """R^2 on the second half of a least-squares fit (with intercept) of target on vectors on the first half."""
    x = np.c_[np.ones(len(vectors)), vectors]
    half = len(x) // 2
    coef, *_ = np.linalg.lstsq(x[:half], target[:half], rcond=None)
    resid = target[half:] - x[half:] @ coef
    return float(1 - (resid**2).sum() / ((target[half:] - target[half:].mean(0)) ** 2).sum())


def test_vectors_carry_the_hidden_tastes_unless_the_noise_drowns_them():
    cfg = PlantedConfig(n_articles=2000, n_tastes=6, taste_strength=0.0, hidden_taste_strength=1.3, vector_dim=16)
    cat = _catalogue(np.random.default_rng(cfg.seed), cfg)
    profile = cat["log_weight"] - np.log(cat["popularity"])[:, None]  # the hidden style's tastes: no column's
    clean = options.article_vectors(cfg.model_copy(update={"vector_noise": 0.0}), cat["log_weight"], cat["popularity"])
    assert clean.dtype == np.float32 and clean.shape == (2000, 16)
    assert np.allclose(clean.std(0), 1.0, atol=1e-4)
    assert _held_out_r2(clean, profile) > 0.999
    noisy = options.article_vectors(cfg.model_copy(update={"vector_noise": 0.5}), cat["log_weight"],
                                    cat["popularity"])  # fmt: skip
    assert np.allclose((noisy - clean).std(), 0.5, atol=0.02) and _held_out_r2(noisy, profile) > 0.6
    drowned = options.article_vectors(cfg.model_copy(update={"vector_noise": 1000.0}), cat["log_weight"],
                                      cat["popularity"])  # fmt: skip
    assert _held_out_r2(drowned, profile) < 0.02


# --- through the stages: the noise columns change no optimum ------------------------------------------------

STAGE_PLANTED = {"n_outfits": 2000, "n_articles": 300, "n_customers": 300, "n_types": 10, "n_tastes": 8,
                 "vector_dim": 4, **ON}  # fmt: skip


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    roots = {}
    for name, more in (("plain", {}), ("paper", {"context": "paper"})):
        roots[name] = tmp_path_factory.mktemp(name)
        planted_stages(roots[name], {**STAGE_PLANTED, **more}, {}, ("ingest", "validate", "features", "optimum"),
                       evaluate={"fitb": {"enabled": False}})  # fmt: skip
    return roots


def test_the_switch_s_optimum_through_the_stages(projects):
    root = projects["plain"]
    read = lambda name: json.loads((root / "reports" / "eval" / f"{name}.json").read_text())  # noqa: E731
    context, blind = read("optimum_context"), read("optimum_no_context")
    assert context["known"] and blind["known"] and context["test"]["n_cases"] > 500
    assert context["test"]["cross_entropy"] < blind["test"]["cross_entropy"] - 0.05
    # the vectors pass validation to the validated articles
    validated = pq.read_table(root / "data" / "validated" / "articles.parquet")
    assert options.VECTOR_COLUMN in validated.column_names


def test_the_paper_s_noise_columns_change_no_optimum(projects):
    from contextual_bert.data.feature_store import load_split

    plain, paper = projects["plain"], projects["paper"]
    summary = json.loads((paper / "reports" / "validation" / "summary.json").read_text())
    assert all(table["quarantined"] == 0 for table in summary["tables"].values())  # the paper's columns are valid
    d_context = {r: json.loads((r / "data" / "features" / "manifest.json").read_text())["d_context"]
                 for r in (plain, paper)}  # fmt: skip
    assert d_context[paper] == d_context[plain] + 12 * 8  # the twelve columns are read (default_dim 8 here)
    for name in ("optimum_context", "optimum_no_context"):
        a, b = (json.loads((r / "reports" / "eval" / f"{name}.json").read_text()) for r in (plain, paper))
        for split in ("test", "val"):
            assert a[split]["cross_entropy"] == pytest.approx(b[split]["cross_entropy"], abs=1e-12), (name, split)
    test = load_split(paper / "data" / "features", "test", 8)
    items = test.items[:100].clone()
    items[:, 0] = MASK_INDEX
    on_paper = optimum_from_features(paper / "data" / "raw", paper / "data" / "features", True)
    on_plain = optimum_from_features(plain / "data" / "raw", plain / "data" / "features", True)
    assert [name for name, _ in on_paper.context_digits] == [name for name, _ in on_plain.context_digits]
    plain_test = load_split(plain / "data" / "features", "test", 8)
    assert torch.equal(plain_test.items[:100, 1:], items[:, 1:])
    got = on_paper.masked_logits(items, {k: v[:100] for k, v in test.context.items()})
    want = on_plain.masked_logits(items, {k: v[:100] for k, v in plain_test.context.items()})
    assert torch.equal(got, want)
