"""The planted-signal generator: the raw contract, its truth file, and draws that follow the model it claims."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contextual_bert import cpu_kernels
from contextual_bert.config import PlantedConfig
from contextual_bert.data.contract import DATE_COLUMN, TABLES, DataSchema
from contextual_bert.data.planted.tastes import (
    CONTEXT_COLUMNS,
    TRUTH_JSON,
    _catalogue,
    _customers,
    _outfits,
    generate_planted,
    load_truth,
    planted_schema,
)
from contextual_bert.errors import ContextualBertError

SMALL = PlantedConfig(n_outfits=3000, n_articles=400, n_customers=300, n_types=10, n_tastes=6, seed=3)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("raw")
    report = generate_planted(SMALL, out)
    return out, report, {name: pd.read_parquet(out / f"{name}.parquet") for name in TABLES}


def test_writes_the_contract_and_the_truth(data):
    out, report, tables = data
    assert DataSchema.load(out) == planted_schema() and planted_schema().source == "planted"
    assert report["rows"] == {"articles": 400, "customers": 300, "outfits": 3000}
    articles, customers, outfits = tables["articles"], tables["customers"], tables["outfits"]
    assert {"product_type", "style", "color", "brand", "price"} <= set(articles.columns)
    assert articles["product_type"].nunique() == 10 and (articles["price"] > 0).all()
    assert list(customers.columns) == ["customer_id"] + [name for name, _, _ in CONTEXT_COLUMNS]
    sizes = outfits["article_ids"].map(len)
    assert set(sizes) == {4, 5, 6, 7, 8}
    type_of = articles.set_index("article_id")["product_type"]
    # no two articles of one product type share an outfit (so the articles are distinct too)
    assert (outfits["article_ids"].map(lambda ids: type_of[list(ids)].nunique()) == sizes).all()
    truth = load_truth(out)
    assert list(truth.article_ids) == list(articles["article_id"])
    assert list(truth.customer_ids) == list(customers["customer_id"])
    assert (np.array([f"type_{t:01d}" for t in truth.article_type]) == articles["product_type"]).all()
    assert truth.log_weight.shape == (400, 6) and np.allclose(truth.taste_prob.sum(1), 1)
    about = json.loads((out / TRUTH_JSON).read_text())
    assert about["params"]["n_tastes"] == 6 and set(about["context_tables"]) == {
        name for name, _, informative in CONTEXT_COLUMNS if informative
    }


def test_same_seed_same_data_and_the_truth_does_not_depend_on_n_outfits(tmp_path, data):
    out, _, tables = data
    again = generate_planted(SMALL, tmp_path / "again")
    assert again["rows"] == data[1]["rows"]
    for name in TABLES:
        assert pd.read_parquet(tmp_path / "again" / f"{name}.parquet").equals(tables[name]), name
    more = generate_planted(SMALL.model_copy(update={"n_outfits": 5000}), tmp_path / "more")
    assert more["rows"]["outfits"] == 5000
    a, b = load_truth(out), load_truth(tmp_path / "more")
    assert np.array_equal(a.log_weight, b.log_weight) and np.array_equal(a.taste_prob, b.taste_prob)


def _content_hash(out) -> str:
    """sha256 of what generate_planted wrote: the tables' rows, the truth's arrays and both JSON files."""
    h = hashlib.sha256()
    for name in ("articles", "customers", "outfits"):
        table = pq.read_table(out / f"{name}.parquet")  # the dates came later (their own generator): not hashed
        h.update(repr(table.drop_columns([c for c in table.column_names if c == DATE_COLUMN]).to_pylist()).encode())
    with np.load(out / "planted_truth.npz") as z:
        for key in sorted(z.files):
            h.update(np.ascontiguousarray(z[key]).tobytes())
    h.update((out / TRUTH_JSON).read_bytes())
    h.update((out / "ingest_report.json").read_bytes())
    return h.hexdigest()


def numpy_has_avx512() -> bool:
    """Whether numpy dispatches its AVX-512 (Skylake-X) loops here: they decide how the generator's exp and log round."""
    from numpy._core._multiarray_umath import __cpu_features__

    return bool(__cpu_features__.get("AVX512_SKX"))


def test_without_hidden_tastes_the_data_is_what_it_was_before_the_setting(tmp_path):
    cfg = PlantedConfig(n_outfits=500, n_articles=200, n_customers=100, n_types=10, n_tastes=6, seed=3)
    assert cfg.hidden_taste_strength == 0.0
    generate_planted(cfg, tmp_path)
    # computed with the generator of commit 1e8b0b4, before hidden_taste_strength existed, on an Intel Xeon with
    # AVX-512. numpy's AVX-512 loops round otherwise than its AVX2 ones: an AMD EPYC without AVX-512 gave the second
    # hash at a2d7be6 (the same at 3a0268c); an AMD EPYC with it (family 26) gives the first, and the second with
    # numpy's AVX-512 loops switched off (NPY_DISABLE_CPU_FEATURES=X86_V4,AVX512_SKX,...; 2026-12-06). So the data is
    # the same wherever numpy runs its AVX-512 loops, and wherever it does not: not per CPU vendor.
    expected = {
        True: "d746d9469d3a2b84d5ad8755e3e55ac5a74d7b9bd441dfc1fe533e397914f11f",  # Intel Xeon, AMD EPYC (AVX-512)
        False: "9710d87fa9e1aa01d59c226cfad714af92fa64260b83a3236a1b366a4a21848e",  # AMD EPYC (AVX2 only)
    }
    assert _content_hash(tmp_path) == expected[numpy_has_avx512()], cpu_kernels.cpu()


def test_hidden_tastes_are_carried_by_no_column(tmp_path):
    visible = SMALL.model_copy(update={"n_outfits": 500})
    hidden = visible.model_copy(update={"taste_strength": 0.0, "hidden_taste_strength": 1.3})
    generate_planted(visible, tmp_path / "visible")
    generate_planted(hidden, tmp_path / "hidden")
    for name in ("articles", "customers"):  # the same catalogue and customers, column for column
        assert pd.read_parquet(tmp_path / "hidden" / f"{name}.parquet").equals(
            pd.read_parquet(tmp_path / "visible" / f"{name}.parquet")
        ), name
    truth, about = load_truth(tmp_path / "hidden"), json.loads((tmp_path / "hidden" / TRUTH_JSON).read_text())
    base = load_truth(tmp_path / "visible")
    style_and_colour = base.log_weight - truth.log_weight  # the visible taste part, minus the hidden one
    hidden_part = 1.3 * np.array(about["hidden_affinity"])[about["hidden_style"]]
    # log w = log popularity + hidden part: the hidden style alone decides an article's tastes ...
    assert np.allclose(truth.log_weight - hidden_part, truth.log_weight[:, :1] - hidden_part[:, :1], atol=1e-5)
    assert about["params"]["hidden_taste_strength"] == 1.3 and not np.allclose(style_and_colour, 0)
    # ... and no column of the articles table tells it: articles of one style (or colour) have unrelated
    # hidden styles
    articles = pd.read_parquet(tmp_path / "hidden" / "articles.parquet")
    by_style = pd.Series(about["hidden_style"]).groupby(articles["style"].to_numpy()).nunique()
    assert (by_style[articles["style"].value_counts() >= 10] >= 5).all()


def test_bad_sizes_are_one_line_errors(tmp_path):
    with pytest.raises(ContextualBertError, match="n_types"):
        generate_planted(SMALL.model_copy(update={"n_types": 7}), tmp_path)
    with pytest.raises(ContextualBertError, match="n_articles"):
        generate_planted(SMALL.model_copy(update={"n_articles": 9}), tmp_path)


# --- the draws follow the story (internals, with the hidden tastes) ----------------------------------


@pytest.fixture(scope="module")
def story():
    cfg = PlantedConfig(n_outfits=60_000, n_articles=200, n_customers=2000, n_types=10, n_tastes=4, seed=5,
                        context_strength=1.0)  # fmt: skip
    rng = np.random.default_rng(cfg.seed)
    cat = _catalogue(rng, cfg)
    cus = _customers(rng, cfg)
    return cfg, cat, cus, _outfits(rng, cfg, cat, cus, max_set_size=8, min_set_size=4)


def test_tastes_follow_p_of_z_given_the_context(story):
    cfg, _, cus, out = story
    # per value of an informative column: the tastes drawn vs the mean P(z | x) of those outfits' customers
    region = cus["values"]["region"][out["customer"]]
    for value in np.unique(region):
        rows = region == value
        observed = np.bincount(out["taste"][rows], minlength=cfg.n_tastes) / rows.sum()
        expected = cus["taste_prob"][out["customer"][rows]].mean(0)
        se = np.sqrt(expected * (1 - expected) / rows.sum())
        assert (np.abs(observed - expected) < 4.5 * se + 1e-9).all(), (value, observed, expected)
    # and the informative columns do move the tastes: the odds differ between regions
    assert np.ptp(cus["taste_prob"].max(1)) > 0.2


def test_articles_follow_their_type_share_under_the_taste(story):
    cfg, cat, _, out = story
    outfit_taste = out["taste"][out["draw_outfit"]]
    w = np.exp(cat["log_weight"])
    per_type = np.zeros((cfg.n_types, cfg.n_tastes))
    np.add.at(per_type, cat["type"], w)
    share = w / per_type[cat["type"]]  # P(a | t(a), z)
    for z in range(cfg.n_tastes):
        drawn = out["article"][outfit_taste == z]
        observed = np.bincount(drawn, minlength=cfg.n_articles)
        n_of_type = np.bincount(cat["type"][drawn], minlength=cfg.n_types)
        expected = n_of_type[cat["type"]] * share[:, z]
        assert (np.abs(observed - expected) < 5 * np.sqrt(expected) + 2).all(), z
    # and which articles are drawn does depend on the taste
    first = np.bincount(out["article"][outfit_taste == 0], minlength=cfg.n_articles)
    second = np.bincount(out["article"][outfit_taste == 1], minlength=cfg.n_articles)
    assert 0.5 * np.abs(first / first.sum() - second / second.sum()).sum() > 0.2


def test_sizes_and_type_sets_are_uniform(story):
    cfg, cat, _, out = story
    size_share = np.bincount(out["size"], minlength=9)[4:] / cfg.n_outfits
    assert np.allclose(size_share, 0.2, atol=0.01)
    # each type is in an outfit with probability E[n] / T, whatever the customer or the taste
    types = cat["type"][out["article"]]
    for z in range(cfg.n_tastes):
        rows = out["taste"][out["draw_outfit"]] == z
        outfits = len(np.unique(out["draw_outfit"][rows]))
        share = np.bincount(types[rows], minlength=cfg.n_types) / outfits
        assert np.allclose(share, 6.0 / cfg.n_types, atol=0.03), (z, share)


# --- dates and the hidden per-customer taste (issue 40) ---------------------------------------------------


def test_every_outfit_has_a_date_and_strength_0_is_today_s_data(data, tmp_path):
    out, _, tables = data
    assert pq.read_schema(out / "outfits.parquet").field(DATE_COLUMN).type == pa.date32()
    assert tables["outfits"][DATE_COLUMN].notna().all()
    assert SMALL.customer_taste_strength == 0.0 and not load_truth(out).has_customer_taste


def test_a_hidden_customer_taste_moves_only_the_tastes_and_the_truth_holds_it(tmp_path, data):
    out, _, tables = data
    cfg = SMALL.model_copy(update={"customer_taste_strength": 1.5, "n_customer_tastes": 4})
    generate_planted(cfg, tmp_path)
    for name in ("articles", "customers"):
        assert pd.read_parquet(tmp_path / f"{name}.parquet").equals(tables[name]), name
    outfits = pd.read_parquet(tmp_path / "outfits.parquet")
    assert outfits[["outfit_id", "customer_id", DATE_COLUMN]].equals(
        tables["outfits"][["outfit_id", "customer_id", DATE_COLUMN]]
    )
    assert (outfits["article_ids"].map(len) == tables["outfits"]["article_ids"].map(len)).all()
    truth, before = load_truth(tmp_path), load_truth(out)
    assert truth.has_customer_taste and truth.customer_taste_table.shape == (4, SMALL.n_tastes)
    assert np.array_equal(truth.log_weight, before.log_weight)
    # taste_prob is P(z | x) marginalised over the unseen u
    assert np.allclose(np.exp(truth.log_taste_given_u()).mean(axis=1), truth.taste_prob, atol=1e-12)
    assert not np.allclose(truth.taste_prob, before.taste_prob)
