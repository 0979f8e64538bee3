"""The synthetic stylist: contract, determinism, and the planted dependence of outfits on context."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from contextual_bert.config import GeneratorSize
from contextual_bert.data.contract import DATE_COLUMN, DATE_TYPE, PAPER_SCHEMA, TABLES, DataSchema
from contextual_bert.data.sources.synthetic import generate
from contextual_bert.data.sources.synthetic_world import (
    COLORS,
    DATE_SPAN_DAYS,
    DATE_START,
    OCCASION_RULES,
    PRODUCT_TYPES,
)

SMALL = GeneratorSize(n_outfits=3000, n_articles=1500, n_customers=400)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("raw")
    report = generate(SMALL, seed=7, out_dir=out)
    tables = {name: pd.read_parquet(out / f"{name}.parquet") for name in TABLES}
    return out, report, tables


def _items(tables) -> pd.DataFrame:
    """One row per (outfit, article) with the customer's context and the article's attributes."""
    outfits = tables["outfits"].explode("article_ids").rename(columns={"article_ids": "article_id"})
    items = outfits.merge(tables["articles"], on="article_id").merge(tables["customers"], on="customer_id")
    assert len(items) == tables["outfits"]["article_ids"].map(len).sum()
    return items


def test_writes_the_contract(data):
    out, report, tables = data
    assert DataSchema.load(out) == PAPER_SCHEMA
    assert report["rows"] == {"articles": 1500, "customers": 400, "outfits": 3000}
    assert json.loads((out / "ingest_report.json").read_text())["seed"] == 7
    for name in TABLES:
        for column, logical in PAPER_SCHEMA.columns_of(name).items():
            arrow_type = str(pq.read_schema(out / f"{name}.parquet").field(column).type)
            assert (
                arrow_type == {"string": "string", "float": "double", "list[string]": "list<element: string>"}[logical]
            ), (name, column, arrow_type)
    articles, customers, outfits = tables["articles"], tables["customers"], tables["outfits"]
    assert articles["article_id"].is_unique and customers["customer_id"].is_unique and outfits["outfit_id"].is_unique
    assert (articles["price"] > 0).all()
    sizes = outfits["article_ids"].map(len)
    assert sizes.between(4, 8).all() and set(sizes) == {4, 5, 6, 7, 8}
    assert (outfits["article_ids"].map(lambda ids: len(set(ids))) == sizes).all()
    assert outfits["customer_id"].isin(customers["customer_id"]).all()
    assert set(np.concatenate(outfits["article_ids"].to_numpy())) <= set(articles["article_id"])
    # every preference points at something the catalogue has
    for column, attribute in [("preferred_brands", "brand"), ("preferred_colors", "color"),
                              ("preferred_styles", "style"), ("nogo_product_types", "product_type")]:  # fmt: skip
        assert set(np.concatenate(customers[column].to_numpy())) <= set(articles[attribute]), column
    assert (customers["price_min"] <= customers["price_max"]).all()


def test_same_seed_same_data_other_seed_other_data(data, tmp_path):
    out, _, tables = data
    generate(SMALL, seed=7, out_dir=tmp_path / "again")
    generate(SMALL, seed=8, out_dir=tmp_path / "other")
    for name in TABLES:
        again = pq.read_table(tmp_path / "again" / f"{name}.parquet")
        assert again.equals(pq.read_table(out / f"{name}.parquet")), name
    other = pd.read_parquet(tmp_path / "other" / "outfits.parquet")
    assert not other["article_ids"].map(tuple).equals(tables["outfits"]["article_ids"].map(tuple))


def test_no_outfit_uses_a_nogo_type_of_its_customer(data):
    items = _items(data[2])
    nogo = [ptype in set(nogos) for ptype, nogos in zip(items["product_type"], items["nogo_product_types"])]
    assert not any(nogo)
    assert data[2]["customers"]["nogo_product_types"].map(len).gt(0).mean() > 0.4  # the rule is exercised
    assert data[1]["planted_signal"]["items_of_nogo_type"] == 0.0


def _share_in_preferences(items, articles, column, attribute) -> tuple[float, float]:
    """Share of outfit items whose attribute the customer prefers, and the same share for the catalogue."""
    chosen = np.mean([a in set(p) for a, p in zip(items[attribute], items[column])])
    per_customer = {
        customer: articles[attribute].isin(set(prefs)).mean()
        for customer, prefs in items.drop_duplicates("customer_id")[["customer_id", column]].itertuples(index=False)
    }
    return chosen, items["customer_id"].map(per_customer).mean()


def test_preferences_are_over_represented(data):
    articles, items = data[2]["articles"], _items(data[2])
    for column, attribute in [("preferred_styles", "style"), ("preferred_brands", "brand"),
                              ("preferred_colors", "color")]:  # fmt: skip
        chosen, catalogue = _share_in_preferences(items, articles, column, attribute)
        assert chosen > 1.5 * catalogue, (column, chosen, catalogue)
    in_range = items["price"].between(items["price_min"], items["price_max"]).mean()
    customers = data[2]["customers"]
    catalogue_in_range = np.mean(
        [articles["price"].between(lo, hi).mean() for lo, hi in zip(customers["price_min"], customers["price_max"])]
    )
    assert in_range > catalogue_in_range


def _top_style_share(items: pd.DataFrame) -> float:
    """Mean over outfits of the share of items in the outfit's most common style."""
    per_style = items.groupby(["outfit_id", "style"]).size().groupby("outfit_id").max()
    return float((per_style / items.groupby("outfit_id").size()).mean())


def test_articles_co_occur_by_style_and_context_is_not_deterministic(data):
    items = _items(data[2])
    shuffled = items.assign(style=np.random.default_rng(0).permutation(items["style"].to_numpy()))
    assert _top_style_share(items) > _top_style_share(shuffled) + 0.08
    # yet plenty of items are in none of the customer's styles
    outside = np.mean([s not in set(p) for s, p in zip(items["style"], items["preferred_styles"])])
    assert outside > 0.2


def test_occasion_drives_product_types(data):
    items = _items(data[2])
    sport_types = {t for t, w in OCCASION_RULES["sport"]["types"].items() if w >= 3}
    is_sport_type = items["product_type"].isin(sport_types)
    assert is_sport_type[items["occasion"] == "sport"].mean() > 3 * is_sport_type[items["occasion"] != "sport"].mean()
    # men never get articles cut only for women
    women_only = {t for t, (_, cut, _) in PRODUCT_TYPES.items() if cut == "w"}
    assert not items.loc[items["gender_y"] == "male", "product_type"].isin(women_only).any()


def test_too_few_articles_is_a_clear_error(tmp_path):
    from contextual_bert.errors import ContextualBertError

    with pytest.raises(ContextualBertError, match="n_articles is 10; at least"):
        generate(GeneratorSize(n_outfits=10, n_articles=10, n_customers=5), seed=0, out_dir=tmp_path)


def test_generated_outfits_never_exceed_model_max_set_size(tmp_path):
    from contextual_bert.config import IngestConfig

    size = GeneratorSize(n_outfits=400, n_articles=200, n_customers=100)
    generate(size, seed=0, out_dir=tmp_path / "six", max_set_size=6)
    lengths = pq.read_table(tmp_path / "six" / "outfits.parquet").column("article_ids").to_pandas().map(len)
    assert lengths.max() == 6 and lengths.min() == IngestConfig().min_set_size
    generate(size, seed=0, out_dir=tmp_path / "three", max_set_size=6, min_set_size=3)
    lengths = pq.read_table(tmp_path / "three" / "outfits.parquet").column("article_ids").to_pandas().map(len)
    assert lengths.min() == 3 and lengths.max() == 6  # ingest.min_set_size: the smallest outfit drawn
    from contextual_bert.errors import ContextualBertError

    with pytest.raises(ContextualBertError, match="max_set_size 3"):
        generate(size, seed=0, out_dir=tmp_path / "three", max_set_size=3)


# --- dates and the customers' hidden tastes (issue 40) ----------------------------------------------------


def test_every_outfit_has_a_date_over_about_two_years(data):
    out, _, tables = data
    assert pq.read_schema(out / "outfits.parquet").field(DATE_COLUMN).type == DATE_TYPE
    days = pd.to_datetime(tables["outfits"][DATE_COLUMN])
    assert days.notna().all()
    assert (DATE_START <= days.min().to_datetime64()) and (days.max() - days.min()).days >= 0.95 * DATE_SPAN_DAYS
    assert (days.max() - days.min()).days < DATE_SPAN_DAYS


def _hidden(seed: int, size: GeneratorSize, strength: float) -> dict:
    """The hidden tastes generate() draws (from their own stream), recomputed."""
    from contextual_bert.data.sources.synthetic_world import (
        TASTE_STREAM,
        _hidden_tastes,
        _make_articles,
        _make_customers,
    )

    rng = np.random.default_rng(seed)
    art = _make_articles(rng, size.n_articles)
    cus = _make_customers(rng, size.n_customers, art)
    return _hidden_tastes(np.random.default_rng([seed, TASTE_STREAM]), cus["n"], art, strength)


def test_customer_taste_strength_0_draws_the_articles_as_without_hidden_tastes(tmp_path, monkeypatch):
    """Strength 0 consults no taste at all: the tables are those of a run where the hidden tastes cannot be
    drawn; strength > 0 moves only the article draws (the same customers, occasions, sizes and dates)."""
    import contextual_bert.data.sources.synthetic as generator

    generate(SMALL, seed=7, out_dir=tmp_path / "zero", customer_taste_strength=0.0)
    generate(SMALL, seed=7, out_dir=tmp_path / "one", customer_taste_strength=1.0)

    def no_tastes(rng, n, art, strength):
        assert strength == 0
        return dict(hidden_brand=None, hidden_color=None)

    monkeypatch.setattr(generator, "_hidden_tastes", no_tastes)
    generate(SMALL, seed=7, out_dir=tmp_path / "without", customer_taste_strength=0.0)
    for name in TABLES:
        zero, without = (pq.read_table(tmp_path / d / f"{name}.parquet") for d in ("zero", "without"))
        assert zero.equals(without), name
    zero, one = (pd.read_parquet(tmp_path / d / "outfits.parquet") for d in ("zero", "one"))
    for name in ("articles", "customers"):
        assert pq.read_table(tmp_path / "zero" / f"{name}.parquet").equals(
            pq.read_table(tmp_path / "one" / f"{name}.parquet")
        )
    same = ["outfit_id", "customer_id", "occasion", DATE_COLUMN]
    assert zero[same].equals(one[same])
    assert (zero["article_ids"].map(len) == one["article_ids"].map(len)).all()
    assert (zero["article_ids"].map(list) != one["article_ids"].map(list)).mean() > 0.3


def test_the_hidden_favourite_brand_and_colour_show_in_the_outfits(tmp_path):
    """At strength 1, items of a customer's hidden brand / colour are over-represented against strength 0's
    draws (the same customers), and the hidden tastes are independent of the declared ones."""
    size = GeneratorSize(n_outfits=6000, n_articles=800, n_customers=300)
    hidden = _hidden(7, size, 1.0)
    customer_row = {f"C{i:07d}": i for i in range(size.n_customers)}
    shares = {}
    for strength in (0.0, 1.0):
        out = tmp_path / str(strength)
        generate(size, seed=7, out_dir=out, customer_taste_strength=strength)
        tables = {name: pd.read_parquet(out / f"{name}.parquet") for name in TABLES}
        items = _items(tables)
        c = items["customer_id"].map(customer_row).to_numpy()
        brand_number = items["brand"].str.removeprefix("brand_").astype(int).to_numpy()
        color_number = items["color"].map({name: i for i, name in enumerate(COLORS)}).to_numpy()
        shares[strength] = (
            (brand_number == hidden["hidden_brand"][c]).mean(),
            (color_number == hidden["hidden_color"][c]).mean(),
        )
    assert shares[1.0][0] > 1.5 * shares[0.0][0]  # x3 on the hidden brand
    assert shares[1.0][1] > 1.3 * shares[0.0][1]  # x2 on the hidden colour
