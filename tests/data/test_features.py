import json
import os

import numpy as np
import pandas as pd
import pytest
from feature_data import PAPER_DIMS, build_paper_features, paper_cfg, paper_tables, write_validated

from contextual_bert.config import FeaturesConfig
from contextual_bert.data.contract import HM_SCHEMA, PAPER_SCHEMA
from contextual_bert.data.feature_spec import MISSING_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX
from contextual_bert.data.feature_store import MANIFEST_FILE, load_article_vocab, load_spec, load_split
from contextual_bert.data.features import assign_splits, build_features
from contextual_bert.errors import ContextualBertError, DataError


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    return build_paper_features(tmp_path_factory.mktemp("paper"))


def test_files_manifest_and_paper_d_context(paper):
    features_dir, manifest, (articles, customers, outfits) = paper
    for name in (
        "article_vocab.parquet",
        "context_vocab.json",
        "customers.parquet",
        "outfits.parquet",
        "spec.json",
        "manifest.json",
    ):
        assert (features_dir / name).exists(), name
    assert json.loads((features_dir / MANIFEST_FILE).read_text()) == json.loads(json.dumps(manifest))
    spec = load_spec(features_dir)
    assert spec.d_context == 736 == manifest["d_context"]
    assert [f.name for f in spec.features] == [c.name for c in PAPER_SCHEMA.context_columns]
    assert {f.name: f.dim for f in spec.features} == PAPER_DIMS
    assert {f.name for f in spec.features if f.source == "outfit"} == {"occasion"}
    rows = manifest["rows"]
    assert rows["train"] + rows["val"] + rows["test"] == len(outfits) == rows["outfits"]
    assert set(manifest["inputs"]) == {"articles.parquet", "customers.parquet", "outfits.parquet", "schema.json"}
    assert all(len(h) == 64 for h in manifest["inputs"].values())
    # article attributes off: the files (manifest included) are those of the stage before attributes existed,
    # so their DVC hash and the trained models' lineage do not change
    assert not set(os.listdir(features_dir)) - {
        "article_vocab.parquet",
        "context_vocab.json",
        "customers.parquet",
        "outfits.parquet",
        "spec.json",
        "manifest.json",
    }
    assert not {"article_features", "article_attributes"} & set(manifest["params"])


def test_hm_columns_get_default_dims(tmp_path):
    articles, _, outfits = paper_tables(n_outfits=400)
    rng = np.random.default_rng(1)
    n = 300
    customers = pd.DataFrame(
        {
            "customer_id": [f"c{i:04d}" for i in range(n)],
            "age": rng.integers(16, 90, n).astype(float),
            "club_member_status": rng.choice(["ACTIVE", "PRE-CREATE", None], n),
            "fashion_news_frequency": rng.choice(["NONE", "Regularly"], n),
            "FN": rng.choice(["1.0", None], n),
            "Active": rng.choice(["1.0", None], n),
            "postal_code": [f"p{i}" for i in range(n)],  # unique per customer: every one rarer than min count 2
        }
    )
    validated = write_validated(
        tmp_path / "validated", HM_SCHEMA, articles, customers, outfits.drop(columns="occasion")
    )
    cfg = FeaturesConfig(embedding_dims=PAPER_DIMS, default_dim=16)
    manifest = build_features(validated, tmp_path / "features", cfg, max_set_size=8)
    dims = {f["name"]: f["dim"] for f in manifest["spec"]}
    assert dims == {
        "age": 32,
        "club_member_status": 16,
        "fashion_news_frequency": 16,
        "FN": 16,
        "Active": 16,
        "postal_code": 16,
    }
    assert manifest["d_context"] == 32 + 5 * 16
    assert manifest["vocab_sizes"]["postal_code"] == N_SPECIAL  # all values below min_context_count
    train = load_split(tmp_path / "features", "train", 8)
    assert set(train.context["postal_code"].unique().tolist()) == {UNKNOWN_INDEX}


def test_categorical_and_numeric_vocabularies_are_fit_on_train(paper):
    features_dir, _, (_, customers, outfits) = paper
    vocab = json.loads((features_dir / "context_vocab.json").read_text())
    out = pd.read_parquet(features_dir / "outfits.parquet")
    train_customers = customers[customers["customer_id"].isin(out.loc[out["split"] == "train", "customer_id"])]
    assert vocab["gender"]["values"] == sorted(train_customers["gender"].dropna().unique())
    edges = vocab["age"]["bucket_edges"]
    assert len(edges) == 9 and edges == sorted(edges)
    expected = np.quantile(train_customers["age"].dropna(), np.linspace(0, 1, 11)[1:-1])
    np.testing.assert_allclose(edges, np.unique(expected))

    enc = pd.read_parquet(features_dir / "customers.parquet").set_index("customer_id")
    raw = customers.set_index("customer_id")
    assert (enc.loc[raw["age"].isna(), "age"] == MISSING_INDEX).all()
    assert (enc.loc[raw["gender"].isna(), "gender"] == MISSING_INDEX).all()
    known = raw["age"].notna()
    expected_age = np.searchsorted(edges, raw.loc[known, "age"], side="right") + N_SPECIAL
    np.testing.assert_array_equal(enc.loc[known, "age"].to_numpy(), expected_age)
    assert enc.loc[known, "age"].between(N_SPECIAL, N_SPECIAL + len(edges)).all()


def test_multi_valued_cap_keeps_first_listed_and_empty_is_missing(paper):
    features_dir, _, (_, customers, _) = paper
    spec = {f.name: f for f in load_spec(features_dir).features}
    assert spec["preferred_brands"].max_values == 8  # lists of up to 10 capped by max_multi_values
    assert spec["preferred_colors"].max_values == 3  # the longest train list is narrower than the cap
    vocab = json.loads((features_dir / "context_vocab.json").read_text())["preferred_brands"]["values"]
    enc = pd.read_parquet(features_dir / "customers.parquet").set_index("customer_id")
    for cid, brands in customers.set_index("customer_id")["preferred_brands"].items():
        stored = list(enc.loc[cid, "preferred_brands"])
        if len(brands) == 0:
            assert stored == [MISSING_INDEX]
        else:
            assert stored == [vocab.index(b) + N_SPECIAL for b in brands][:8]


def test_splits_deterministic_disjoint_and_about_the_fractions():
    ids = [f"outfit-{i}" for i in range(40_000)]
    a = assign_splits(ids, 0.045, 0.045, seed=0)
    assert (a == assign_splits(ids, 0.045, 0.045, seed=0)).all()
    for name, expected in (("val", 0.045), ("test", 0.045), ("train", 0.91)):
        assert abs((a == name).mean() - expected) < 0.005
    # Hash-based: an outfit keeps its split when other outfits are added or removed.
    assert (assign_splits(ids[::3], 0.045, 0.045, seed=0) == a[::3]).all()
    other_seed = assign_splits(ids, 0.045, 0.045, seed=1)
    assert (other_seed != a).mean() > 0.1


def test_split_is_stored_and_held_out_outfits_are_disjoint(paper):
    features_dir, manifest, _ = paper
    loaded = {name: load_split(features_dir, name, 8) for name in ("train", "val", "test")}
    ids = {name: set(split.outfit_ids) for name, split in loaded.items()}
    assert not ids["train"] & ids["val"] and not ids["train"] & ids["test"] and not ids["val"] & ids["test"]
    assert {name: len(s) for name, s in loaded.items()} == {k: manifest["rows"][k] for k in loaded}
    assert 0.02 < manifest["rows"]["val"] / manifest["rows"]["outfits"] < 0.08


def test_article_vocab_min_count_counts_and_specials(paper):
    features_dir, manifest, (_, _, outfits) = paper
    vocab = load_article_vocab(features_dir)
    assert vocab.ids[:3] == ["[PAD]", "[MASK]", "[UNK]"] and vocab.counts[:3].tolist() == [0, 0, 0]
    assert len(vocab) == manifest["n_items"]
    table = pd.read_parquet(features_dir / "article_vocab.parquet")
    assert table["index"].tolist() == list(range(len(vocab)))
    stored = pd.read_parquet(features_dir / "outfits.parquet")
    train_ids = outfits.set_index("outfit_id").loc[stored.loc[stored["split"] == "train", "outfit_id"]]
    counts = train_ids["article_ids"].explode().value_counts()
    for article in ("a0000", "a0100"):
        (idx,), unknown = vocab.to_indices([article])
        assert vocab.counts[idx] == counts[article] and not unknown
    # a0199 is in one outfit only: below min_article_count=2 -> [UNK]
    idx, unknown = vocab.to_indices(["a0199", "a0001", "never-seen"])
    assert idx[0] == UNKNOWN_INDEX and idx[2] == UNKNOWN_INDEX and unknown == ["a0199", "never-seen"]
    assert vocab.to_ids(idx) == ["[UNK]", "a0001", "[UNK]"]
    assert (np.diff(vocab.counts[N_SPECIAL:]) <= 0).all()  # most frequent first


def test_outfit_longer_than_max_set_size_names_file_and_row(tmp_path):
    articles, customers, outfits = paper_tables(n_outfits=300)
    validated = write_validated(tmp_path / "validated", PAPER_SCHEMA, articles, customers, outfits)
    first_too_long = int(np.flatnonzero(outfits["article_ids"].map(len) > 6)[0])
    with pytest.raises(
        DataError, match=rf"outfits.parquet, row {first_too_long}, column 'article_ids'.*max_set_size=6"
    ):
        build_features(validated, tmp_path / "features", paper_cfg(), max_set_size=6)


def test_missing_inputs_and_features_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="schema.json"):
        build_features(tmp_path / "nothing", tmp_path / "features", paper_cfg(), max_set_size=8)
    with pytest.raises(DataError, match="spec.json.*contextual-bert features"):
        load_split(tmp_path, "train", 8)
    with pytest.raises(ContextualBertError, match="unknown split"):
        load_split(tmp_path, "holdout", 8)


def test_outfits_without_a_customer_or_its_row_have_customer_context_missing(tmp_path):
    articles, customers, outfits = paper_tables(n_outfits=400)
    outfits = outfits.copy()
    outfits.loc[outfits.index % 3 == 0, "customer_id"] = None  # curated: no customer
    outfits.loc[outfits.index % 3 == 1, "customer_id"] = "c-without-row"
    validated = write_validated(tmp_path / "validated", PAPER_SCHEMA, articles, customers, outfits)
    manifest = build_features(validated, tmp_path / "features", paper_cfg(), max_set_size=8)
    assert manifest["rows"]["outfits"] == 400
    stored = pd.read_parquet(tmp_path / "features" / "outfits.parquet").set_index("outfit_id")
    for split in ("train", "val", "test"):
        data = load_split(tmp_path / "features", split, 8)
        no_row = ~stored.loc[data.outfit_ids, "customer_id"].isin(customers["customer_id"]).to_numpy()
        assert no_row.any() and (~no_row).any()
        assert (data.context["gender"][no_row] == MISSING_INDEX).all()
        assert (data.context["preferred_brands"][no_row, 0] == MISSING_INDEX).all()
        assert (data.context["preferred_brands"][no_row, 1:] == PAD_INDEX).all()
    assert stored["customer_id"].isna().sum() == (outfits["customer_id"].isna()).sum()


def test_split_without_known_validation_target_stops_features_with_one_line(tmp_path):
    """The issue's case: the validation outfits hold only articles that no train outfit has."""
    articles, customers, outfits = paper_tables(n_outfits=400)
    split = assign_splits(outfits["outfit_id"].tolist(), 0.045, 0.045, 0)
    outfits = outfits.copy()
    val_rows = np.flatnonzero(split == "val")
    outfits["article_ids"] = [
        [f"only-in-val-{i}-{j}" for j in range(4)] if i in set(val_rows) else ids
        for i, ids in enumerate(outfits["article_ids"])
    ]
    validated = write_validated(tmp_path / "validated", PAPER_SCHEMA, articles, customers, outfits)
    with pytest.raises(ContextualBertError) as info:
        build_features(validated, tmp_path / "features", paper_cfg(), max_set_size=8)
    message = str(info.value)
    assert "\n" not in message
    assert "the val split has only 0 known targets" in message
    assert "features.min_known_targets=10" in message and "features.val_fraction" in message
    assert not (tmp_path / "features" / "manifest.json").exists()


def test_too_few_outfits_in_a_split_names_the_threshold(tmp_path):
    articles, customers, outfits = paper_tables(n_outfits=300)
    validated = write_validated(tmp_path / "validated", PAPER_SCHEMA, articles, customers, outfits)
    split = assign_splits(outfits["outfit_id"].tolist(), 0.045, 0.045, 0)
    n_val, n_test = int((split == "val").sum()), int((split == "test").sum())
    with pytest.raises(
        ContextualBertError,
        match=rf"the val split has only {n_val} outfits "
        rf"\(features.min_split_outfits={n_val + 1}\).*val_fraction",
    ):
        build_features(
            validated,
            tmp_path / "features",
            paper_cfg(min_split_outfits=n_val + 1, min_known_targets=1),
            max_set_size=8,
        )
    build_features(
        validated,
        tmp_path / "features",
        paper_cfg(min_split_outfits=min(n_val, n_test), min_known_targets=1),
        max_set_size=8,
    )


# --- article attributes: the catalogue (issue 14) -----------------------------------------------------------

ATTRIBUTES = {"synthetic": {"product_type": "categorical", "color": "categorical", "price": "numeric"}}


def _catalogue_features(root, **overrides):
    from contextual_bert.data.contract import DataSchema

    articles, customers, outfits = paper_tables()
    articles.loc[3, "product_type"] = None  # a missing value: the article stays, its value is missing
    extra = pd.DataFrame(
        {
            "article_id": ["new1", "new2"],
            "product_type": ["top", "gown"],
            "brand": "brand_0",
            "color": ["red", None],
            "style": "casual",
            "price": [12.0, float("nan")],
        }
    )
    articles = pd.concat([articles, extra], ignore_index=True)  # in no outfit: the catalogue still holds them
    schema = DataSchema("synthetic", PAPER_SCHEMA.context_columns)
    validated = write_validated(root / "validated", schema, articles, customers, outfits)
    cfg = paper_cfg(**{"min_article_count": 2, "article_features": True, "article_attributes": ATTRIBUTES, **overrides})
    return build_features(validated, root / "features", cfg, max_set_size=8), articles, outfits


def test_the_catalogue_holds_every_article_with_its_attributes(tmp_path):
    from contextual_bert.data.feature_store import load_catalogue

    manifest, articles, outfits = _catalogue_features(tmp_path)
    features_dir = tmp_path / "features"
    catalogue, vocab = load_catalogue(features_dir), load_article_vocab(features_dir)
    # the train vocabulary first, in its order; then every other article of the table
    assert catalogue.n_ids == len(vocab) and catalogue.vocab.ids[: len(vocab)] == vocab.ids
    assert set(catalogue.vocab.ids[N_SPECIAL:]) == set(articles["article_id"])
    assert len(catalogue) == N_SPECIAL + len(articles) == manifest["catalogue"]["articles"] + N_SPECIAL
    index = {a: i for i, a in enumerate(catalogue.vocab.ids)}
    assert index["new1"] >= catalogue.n_ids and index["a0199"] >= catalogue.n_ids  # a0199: below the min count
    pt, color, price = (catalogue.attributes[k] for k in ("product_type", "color", "price"))
    assert (pt[:N_SPECIAL] == PAD_INDEX).all() and (price[:N_SPECIAL] == PAD_INDEX).all()
    assert pt[index["a0003"]] == MISSING_INDEX
    assert pt[index["new2"]] == UNKNOWN_INDEX  # "gown": no trained article has it
    assert color[index["new2"]] == MISSING_INDEX and price[index["new2"]] == MISSING_INDEX
    assert pt[index["new1"]] == pt[index[articles.loc[articles["product_type"] == "top", "article_id"].iloc[0]]]
    assert (pt[N_SPECIAL:] >= MISSING_INDEX).all()  # no article without an index
    assert manifest["catalogue"]["missing"]["product_type"] == 1
    # Items by catalogue index for the attribute models; ids-only models read those beyond the vocabulary as [UNK].
    row = [i for i, ids in enumerate(outfits["article_ids"]) if "a0199" in ids][0]
    outfit_id = outfits["outfit_id"].iloc[row]
    for catalogue_items, expected in ((True, index["a0199"]), (False, UNKNOWN_INDEX)):
        split = load_split(features_dir, "train", 8, catalogue=catalogue_items)
        items = split.items[split.outfit_ids.index(outfit_id)].tolist()
        assert expected in items


def test_attributes_off_write_no_catalogue_and_the_same_items(tmp_path):
    _catalogue_features(tmp_path / "on")
    articles, customers, outfits = paper_tables()
    validated = write_validated(tmp_path / "off" / "validated", PAPER_SCHEMA, articles, customers, outfits)
    build_features(validated, tmp_path / "off" / "features", paper_cfg(min_article_count=2), max_set_size=8)
    assert not (tmp_path / "off" / "features" / "catalogue.parquet").exists()
    for split in ("train", "test"):
        on = load_split(tmp_path / "on" / "features", split, 8)
        off = load_split(tmp_path / "off" / "features", split, 8)
        assert on.outfit_ids == off.outfit_ids and bool((on.items == off.items).all())


def test_an_absent_attribute_is_a_one_line_error_and_a_source_without_any_has_no_catalogue(tmp_path):
    with pytest.raises(DataError, match="'fabric'.*not a column of the articles table"):
        _catalogue_features(tmp_path / "a", article_attributes={"synthetic": {"fabric": "categorical"}})
    # none declared for this source (a newcomer's outfits): the models of ids only, and the manifest says why
    manifest, _, _ = _catalogue_features(tmp_path / "b", article_attributes={"hm": {"product_type": "categorical"}})
    assert "catalogue" not in manifest and "no attribute for the source 'synthetic'" in manifest["no_catalogue"]
    assert not (tmp_path / "b" / "features" / "catalogue.parquet").exists()
