"""Validated tables with the paper's columns, for the tests of the features stage and of the feature store."""

import numpy as np
import pandas as pd

from contextual_bert.config import FeaturesConfig, load_config
from contextual_bert.data.contract import PAPER_SCHEMA, DataSchema
from contextual_bert.data.features import build_features

PAPER_DIMS = load_config("params.yaml").features.embedding_dims
BRANDS = [f"brand_{i}" for i in range(12)]


def paper_tables(n_customers=300, n_outfits=2400, n_articles=200, seed=0):
    """A small validated data set with the paper's columns, some missing values and one rare article."""
    rng = np.random.default_rng(seed)
    articles = pd.DataFrame(
        {
            "article_id": [f"a{i:04d}" for i in range(n_articles)],
            "product_type": rng.choice(["top", "trousers", "shoes", "bag"], n_articles),
            "brand": rng.choice(BRANDS, n_articles),
            "color": rng.choice(["red", "blue", "black"], n_articles),
            "style": rng.choice(["casual", "formal"], n_articles),
            "price": rng.uniform(5, 200, n_articles),
        }
    )

    def some(options, low, high):
        return [list(rng.choice(options, rng.integers(low, high + 1), replace=False)) for _ in range(n_customers)]

    age = rng.integers(18, 80, n_customers).astype(float)
    age[::17] = np.nan
    gender = rng.choice(["f", "m", "d"], n_customers).astype(object)
    gender[::13] = None
    customers = pd.DataFrame(
        {
            "customer_id": [f"c{i:04d}" for i in range(n_customers)],
            "age": age,
            "gender": gender,
            "country": rng.choice(["de", "fr", "it", "es"], n_customers),
            "preferred_brands": some(BRANDS, 0, 10),
            "preferred_colors": some(["red", "blue", "black", "white"], 1, 3),
            "preferred_styles": some(["casual", "formal", "sporty"], 0, 2),
            "nogo_product_types": some(["top", "shoes", "bag"], 0, 2),
            "size_top": rng.choice(["S", "M", "L"], n_customers),
            "size_bottom": rng.choice(["34", "36", "38"], n_customers),
            "size_shoes": rng.choice(["38", "40", "42"], n_customers),
            "price_min": rng.uniform(5, 30, n_customers),
            "price_max": rng.uniform(50, 300, n_customers),
        }
    )
    # Article a0199 is only in one outfit, so a min count of 2 sends it to [UNK].
    common = [f"a{i:04d}" for i in range(n_articles - 1)]
    article_ids = [list(rng.choice(common, rng.integers(4, 9), replace=False)) for _ in range(n_outfits)]
    article_ids[5] = article_ids[5][:-1] + [f"a{n_articles - 1:04d}"]
    outfits = pd.DataFrame(
        {
            "outfit_id": [f"o{i:06d}" for i in range(n_outfits)],
            "customer_id": rng.choice(customers["customer_id"], n_outfits),
            "article_ids": article_ids,
            "occasion": rng.choice(["work", "party", "leisure"], n_outfits),
        }
    )
    return articles, customers, outfits


def write_validated(directory, schema: DataSchema, articles, customers, outfits):
    directory.mkdir(parents=True, exist_ok=True)
    articles.to_parquet(directory / "articles.parquet")
    customers.to_parquet(directory / "customers.parquet")
    outfits.to_parquet(directory / "outfits.parquet")
    schema.save(directory)
    return directory


def paper_cfg(**overrides):
    # the shares these fixtures were written for (params.yaml holds 0.08 each)
    return FeaturesConfig(embedding_dims=PAPER_DIMS, **{"val_fraction": 0.045, "test_fraction": 0.045, **overrides})


def build_paper_features(root):
    """(features dir, manifest, raw tables) of `paper_tables()` through the features stage."""
    tables = paper_tables()
    validated = write_validated(root / "validated", PAPER_SCHEMA, *tables)
    manifest = build_features(validated, root / "features", paper_cfg(min_article_count=2), max_set_size=8)
    return root / "features", manifest, tables
