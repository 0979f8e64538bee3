"""Curated sets with a products table (import_sets.articles): the retailer's outfits in tests/fixtures/retailer
(90 outfits of 4-8 items as (outfit, item) pairs, a 204-product table, tab-separated, whose columns are spelled
"ITEM_ID", "Product-Type", "Colour", ...; one product line with too few fields, one without an id, one outfit
item without a product row, 86 products in no outfit), Polyvore's item metadata, and the attribute models on
them end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import TINY_MODEL

from contextual_bert.cli import main
from contextual_bert.config import ImportSetsConfig, load_config
from contextual_bert.data.contract import IMPORT_QUARANTINE
from contextual_bert.data.sources.sets import article_name, import_sets
from contextual_bert.errors import DataError

RETAILER = Path(__file__).resolve().parents[1] / "fixtures" / "retailer"
# what a user of that retailer's files sets (docs/curated_products.md)
RETAILER_SETS = {
    "source": str(RETAILER / "outfits.csv"),
    "outfit_column": "Outfit ID",
    "item_column": "Item ID",
    "articles": str(RETAILER / "products.tsv"),
    "article_id_column": "item_id",
    "article_columns": {"color": "Colour"},
}
RETAILER_ATTRIBUTES = {
    "category": "categorical",
    "product_type": "categorical",
    "color": "categorical",
    "fabric": "categorical",
    "gender": "categorical",
    "description": "text",
}


def retailer_import(tmp_path: Path) -> tuple[dict, pd.DataFrame]:
    report = import_sets(RETAILER / "outfits.csv", tmp_path / "raw", ImportSetsConfig(**RETAILER_SETS))
    return report, pd.read_parquet(tmp_path / "raw" / "articles.parquet")


def products_table() -> pd.DataFrame:
    table = pd.read_csv(RETAILER / "products.tsv", sep="\t", dtype=str, on_bad_lines="skip")
    return table.dropna(subset=["ITEM_ID", "Gender"])  # not the two bad lines


@pytest.mark.parametrize(
    "column, name",
    [
        ("Product-Type", "product_type"),
        ("Product Type", "product_type"),
        ("PRODUCT_TYPE", "product_type"),
        (" product.type ", "product_type"),
        ("Colour", "colour"),
    ],
)
def test_a_column_name_maps_whatever_its_case_and_separators(column, name):
    assert article_name(column) == name


def test_products_columns_of_another_case_or_separator_map_right(tmp_path):
    report, articles = retailer_import(tmp_path)
    products = products_table().set_index("ITEM_ID")
    assert report["products"]["columns"]["Product-Type"] == "product_type"
    assert report["products"]["columns"]["Colour"] == "color"  # import_sets.article_columns
    assert report["products"]["columns"]["Product Family"] == "product_family"
    with_row = articles[articles["article_id"].isin(products.index)].set_index("article_id")
    assert len(with_row) == len(products)  # the id column "ITEM_ID" read as item_id, whatever its case
    for ours, theirs in (
        ("product_type", "Product-Type"),
        ("color", "Colour"),
        ("category", "Category"),
        ("description", "Description"),
    ):
        assert (with_row[ours] == products.loc[with_row.index, theirs]).all(), ours


def test_every_kept_outfits_article_with_a_product_row_has_its_attributes(tmp_path):
    _, articles = retailer_import(tmp_path)
    outfits = pd.read_parquet(tmp_path / "raw" / "outfits.parquet")
    in_outfits = {a for ids in outfits["article_ids"] for a in ids}
    known = set(products_table()["ITEM_ID"])
    rows = articles.set_index("article_id").loc[sorted(in_outfits & known)]
    assert rows[["category", "product_type", "color", "fabric", "gender", "description"]].notna().all().all()


def test_an_outfit_item_without_a_product_row_keeps_its_outfit(tmp_path):
    report, articles = retailer_import(tmp_path)
    outfits = pd.read_parquet(tmp_path / "raw" / "outfits.parquet")
    holding = outfits[outfits["article_ids"].map(lambda ids: "P9999" in list(ids))]
    assert len(holding) == 1 and report["sets_kept"] == report["sets"] == 90
    row = articles.set_index("article_id").loc["P9999"]
    assert row[["category", "product_type", "color"]].isna().all()
    assert report["products"]["items_without_product"] == 1


def test_a_product_without_outfits_stays_in_the_catalogue(tmp_path):
    report, articles = retailer_import(tmp_path)
    outfits = pd.read_parquet(tmp_path / "raw" / "outfits.parquet")
    in_outfits = {a for ids in outfits["article_ids"] for a in ids}
    unused = set(products_table()["ITEM_ID"]) - in_outfits
    assert len(unused) == report["products"]["products_without_outfit"] == 86
    assert unused <= set(articles["article_id"]) and articles["article_id"].is_unique


def test_malformed_product_lines_go_to_the_quarantine_with_their_line(tmp_path):
    report, _ = retailer_import(tmp_path)
    quarantine = pd.read_parquet(tmp_path / "raw" / IMPORT_QUARANTINE)
    products = quarantine[quarantine["file"] == "products.tsv"].sort_values("line")
    assert products["line"].tolist() == [13, 24]  # the header is line 1
    assert products["reason"].str.startswith("too few fields").tolist() == [True, False]
    assert products["reason"].iloc[1] == "no article id" and products["column"].iloc[1] == "item_id"
    assert report["products"]["lines_rejected"] == 1 and report["products"]["without_id"] == 1


def test_polyvore_item_metadata_keyed_by_id(tmp_path):
    sets = [{"set_id": "s1", "items": [{"item_id": "1"}, {"item_id": "2"}, {"item_id": "3"}, {"item_id": "4"}]}]
    (tmp_path / "sets.json").write_text(json.dumps(sets))
    metadata = {
        "1": {
            "title": "Black Skinny Jeans",
            "description": "Stretch denim",
            "semantic_category": "bottoms",
            "categories": ["Jeans", "Skinny"],
        },
        "2": {"title": "White tee", "semantic_category": "tops", "categories": ["Tops"]},
        "9": {"title": "Red bag", "semantic_category": "bags", "categories": []},
    }
    (tmp_path / "polyvore_item_metadata.json").write_text(json.dumps(metadata))
    report = import_sets(
        tmp_path / "sets.json", tmp_path / "raw", ImportSetsConfig(articles=tmp_path / "polyvore_item_metadata.json")
    )
    articles = pd.read_parquet(tmp_path / "raw" / "articles.parquet").set_index("article_id")
    assert list(articles.index) == ["1", "2", "3", "4", "9"]
    assert articles.loc["1", "title"] == "Black Skinny Jeans" and articles.loc["2", "semantic_category"] == "tops"
    assert list(articles.loc["1", "categories"]) == ["Jeans", "Skinny"]
    assert articles.loc[["3", "4"], "title"].isna().all() and report["products"]["items_without_product"] == 2


def test_bad_products_tables_are_one_line_errors(tmp_path):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("outfit_id,item_id\n" + "".join(f"o,{i}\n" for i in range(4)))
    products = tmp_path / "products.csv"
    products.write_text("item_id,Colour,colour\n1,red,blue\n")
    with pytest.raises(
        DataError,
        match=r"products.csv, column 'colour': two products columns are both read as "
        r"'colour'",
    ) as error:
        import_sets(pairs, tmp_path / "raw", ImportSetsConfig(articles=products))
    assert "\n" not in str(error.value)
    products.write_text("sku,colour\n1,red\n")
    with pytest.raises(DataError, match=r"products.csv, column 'item_id': required column missing"):
        import_sets(pairs, tmp_path / "raw", ImportSetsConfig(articles=products))
    with pytest.raises(DataError, match=r"column 'Color': import_sets.article_columns maps color"):
        import_sets(
            pairs,
            tmp_path / "raw",
            ImportSetsConfig(articles=products, article_id_column="sku", article_columns={"color": "Color"}),
        )


def retailer_params(tmp_path: Path) -> Path:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "paths": {k: str(tmp_path / v) for k, v in [("raw_dir", "raw"), ("validated_dir", "validated"),
                  ("quarantine_dir", "quarantine"), ("features_dir", "features"), ("models_dir", "models"),
                  ("reports_dir", "reports")]},
        "ingest": {"source": "sets"}, "import_sets": RETAILER_SETS, "model": TINY_MODEL,
        "features": {"article_features": True, "article_attributes": {"sets": RETAILER_ATTRIBUTES},
                     "val_fraction": 0.2, "test_fraction": 0.2, "min_split_outfits": 5, "min_known_targets": 5},
        "train": {"models": ["none_attrs"], "seeds": [0], "max_epochs": 2, "batch_size": 16, "device": "cpu",
                  "num_threads": 1},
        "per_model": {"none_attrs": {"id_dropout": 0.5}},
    }))  # fmt: skip
    return params


def test_attribute_models_train_and_rank_unseen_targets_on_the_retailers_outfits(tmp_path):
    params = retailer_params(tmp_path)
    for stage in ("ingest", "validate", "features"):
        assert main(["--params", str(params), stage]) == 0, stage
    cfg = load_config(params)
    manifest = json.loads((cfg.paths.features_dir / "manifest.json").read_text())
    spec = {f["name"]: f for f in manifest["catalogue"]["spec"]}
    assert spec["description"]["kind"] == "text" and spec["description"]["cardinality"] > 10
    assert manifest["catalogue"]["articles"] == 205  # every product and the item without a product row
    assert manifest["catalogue"]["missing"]["product_type"] == 1  # that item
    from contextual_bert.evaluation.evaluate import evaluate_run
    from contextual_bert.training import train

    run_dir = cfg.run_dir("none_attrs", 0)
    train(cfg.paths.features_dir, run_dir, "none_attrs", 0, cfg.model_for("none_attrs"), cfg.train_for("none_attrs"))
    result = evaluate_run(cfg.paths.features_dir, run_dir, cfg.eval_path("none_attrs-s0"), cfg.evaluate)
    unseen = result["test_unseen"]
    assert unseen["n_cases"] > 0 and np.isfinite(unseen["cross_entropy"])
    assert result["ranked"] == "catalogue" and result["test"]["n_unknown_targets"] == 0
    # the known targets' per-outfit record, to pair with a model of ids only: its sums give the known metrics
    known, written = result["test_known_outfits"], json.loads(cfg.eval_path("none_attrs-s0").read_text())
    assert sum(known["cases"]) == result["test_known"]["n_cases"] and written["test_known_outfits"] == known
    assert sum(known["sums"]["cross_entropy"]) / sum(known["cases"]) == pytest.approx(
        result["test_known"]["cross_entropy"], abs=1e-6
    )
    assert result["fitb"]["hard"]["attribute"] == "product_type" and 0 <= result["test"]["fitb_hard"] <= 1


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_products_vector_column_is_an_article_vector_of_every_product(tmp_path, suffix):
    # a retailer's products table with each product's image embedding (a list of floats) and integer tag codes
    products = products_table().reset_index(drop=True)
    rng = np.random.default_rng(0)
    products["Image Embedding"] = [rng.normal(size=5).round(4).tolist() for _ in range(len(products))]
    products.at[3, "Image Embedding"] = None  # a product without one
    products["tags"] = [[1, 2] for _ in range(len(products))]
    path = tmp_path / f"products{suffix}"
    if suffix == ".jsonl":
        products.to_json(path, orient="records", lines=True)
    else:
        products.to_parquet(path)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "paths": {k: str(tmp_path / k) for k in ("raw_dir", "validated_dir", "quarantine_dir", "features_dir",
                                                 "reports_dir")} | {"source_fingerprint": str(tmp_path / "s.json")},
        "ingest": {"source": "sets"}, "import_sets": {**RETAILER_SETS, "articles": str(path)},
        "features": {"article_features": True, "val_fraction": 0.2, "test_fraction": 0.2, "min_split_outfits": 5,
                     "min_known_targets": 5, "article_attributes": {"sets": {
                         "product_type": "categorical", "image_embedding": "vector", "tags": "multi_categorical"}}},
    }))  # fmt: skip
    for stage in ("ingest", "validate", "features"):
        assert main(["--params", str(params), stage]) == 0, stage
    cfg = load_config(params)
    raw = pq.read_table(cfg.paths.raw_dir / "articles.parquet")
    assert raw.schema.field("image_embedding").type == pa.list_(pa.float32())
    assert raw.schema.field("tags").type == pa.list_(pa.string())  # whole numbers stay codes, as before
    from contextual_bert.data.feature_store import load_catalogue

    catalogue = load_catalogue(cfg.paths.features_dir)
    vectors = catalogue.attributes["image_embedding"]
    by_id = products.set_index("ITEM_ID")["Image Embedding"]
    unbought = [a for a in catalogue.vocab.ids[catalogue.n_ids :] if a in by_id.index and by_id[a] is not None]
    assert unbought  # products of no training outfit: their vectors are in the catalogue all the same
    row = catalogue.vocab.ids.index(unbought[0])
    scale = catalogue.indexer.vocab["image_embedding"]["scale"]
    np.testing.assert_allclose(vectors[row], np.asarray(by_id[unbought[0]]) * scale, rtol=1e-5)
    assert np.isnan(vectors[catalogue.vocab.ids.index(products.at[3, "ITEM_ID"])]).all()
    manifest = json.loads((cfg.paths.features_dir / "manifest.json").read_text())
    assert manifest["catalogue"]["missing"]["image_embedding"] == 2  # that product and the item without a row


def test_vectors_derived_from_the_products_text_rank_the_unseen_targets_on_the_retailers_outfits(tmp_path):
    # the `sets` path as the H&M study's derived cell: one vector per product from its description (TF-IDF + SVD
    # over every product, bought or not), the product type beside it, through training and evaluation
    params = retailer_params(tmp_path)
    settings = yaml.safe_load(params.read_text())
    settings["features"]["derived_vectors"] = {"text": {"columns": ["description"], "dim": 8}}
    settings["features"]["article_attributes"] = {"sets": {"product_type": "categorical", "text": "vector"}}
    params.write_text(yaml.safe_dump(settings))
    for stage in ("ingest", "validate", "features"):
        assert main(["--params", str(params), stage]) == 0, stage
    cfg = load_config(params)
    from contextual_bert.data.feature_store import load_catalogue
    from contextual_bert.evaluation.evaluate import evaluate_run
    from contextual_bert.training import train

    catalogue = load_catalogue(cfg.paths.features_dir)
    vectors = catalogue.attributes["text"]
    assert vectors.shape[1] == 8 and np.isfinite(vectors[catalogue.n_ids :]).all(axis=1).sum() > 0
    run_dir = cfg.run_dir("none_attrs", 0)
    metrics = train(cfg.paths.features_dir, run_dir, "none_attrs", 0, cfg.model_for("none_attrs"),
                    cfg.train_for("none_attrs"))  # fmt: skip
    # the calibration of the articles without an id, on record: below 0 here, the rate set by hand (0.5) being
    # above the validation's share without an id
    assert metrics["id_dropout"] == 0.5 and -5 < metrics["unseen_offset"] < 0
    result = evaluate_run(cfg.paths.features_dir, run_dir, cfg.eval_path("none_attrs-s0"), cfg.evaluate)
    unseen = result["test_unseen"]
    assert unseen["n_cases"] > 0 and np.isfinite(unseen["cross_entropy"])
