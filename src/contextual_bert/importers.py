"""Import the H&M Kaggle files ("H&M Personalized Fashion Recommendations") into the raw data contract.

An outfit is the set of distinct articles one customer bought on one day, kept when it has
`import_hm.min_items`..`model.max_set_size` of them. Every other basket is dropped and counted under the first reason that
applies, in this order: too_small, too_large, unknown_customer (not in customers.csv), unknown_article (not
in articles.csv). The counts go to ingest_report.json.

Column mapping (H&M has no brand and no style; the nearest columns stand in, and the report says so):
  product_type <- product_type_name    brand <- section_name (H&M's own lines, e.g. "Divided", "H&M+")
  color <- colour_group_name           style <- graphical_appearance_name (solid, stripe, denim, ...)
  price <- the mean transaction price of the article (H&M publishes prices scaled, not in euros)
Customers keep their columns as context (HM_SCHEMA); age stays numeric, missing values stay missing.
Article ids are normalized to H&M's 10-digit form with leading zeros, however the source wrote them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from contextual_bert.config import ImportHMConfig, ModelConfig
from contextual_bert.contract import HM_SCHEMA
from contextual_bert.errors import DataError

TRANSACTIONS, CUSTOMERS, ARTICLES = "transactions_train.csv", "customers.csv", "articles.csv"
ARTICLE_COLUMNS = {  # contract column <- H&M column
    "product_type": "product_type_name",
    "brand": "section_name",
    "color": "colour_group_name",
    "style": "graphical_appearance_name",
}
EXTRA_ARTICLE_COLUMNS = ("prod_name", "product_group_name", "index_group_name", "garment_group_name")
CUSTOMER_COLUMNS = ("customer_id", "FN", "Active", "club_member_status", "fashion_news_frequency", "age",
                    "postal_code")  # fmt: skip
TRANSACTION_COLUMNS = ("t_dat", "customer_id", "article_id", "price")
MAPPING_NOTE = (
    "H&M has no brand or style: brand <- section_name, style <- graphical_appearance_name; "
    "price <- mean transaction price (H&M's scaled units)"
)
_DIGITS = re.compile(r"^\d+(\.0*)?$")


def normalize_article_ids(ids: pd.Series) -> pd.Series:
    """H&M article ids as 10-digit strings with leading zeros ('108775015', 108775015, '108775015.0' ->
    '0108775015'). Text that is not a whole number is kept as written (stripped); it will match nothing."""
    text = ids.astype("string").str.strip()
    digits = text.str.fullmatch(_DIGITS.pattern).fillna(False).astype(bool)
    whole = text.str.replace(r"\.0*$", "", regex=True).str.zfill(10)
    return text.where(~digits, whole)


def _read_csv(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """Read the named columns of one H&M file as text; missing file, column or bad encoding -> DataError."""
    if not path.is_file():
        raise DataError("file not found (expected the H&M Kaggle file of that name)", path=path)
    try:
        header = pd.read_csv(path, nrows=0, encoding="utf-8").columns
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise DataError(f"not a CSV file ({str(exc).splitlines()[0]})", path=path) from None
    for column in columns:
        if column not in header:
            raise DataError("required column missing", path=path, column=column)
    try:
        return pd.read_csv(
            path, usecols=list(columns), dtype=str, keep_default_na=False, na_values=[""], encoding="utf-8"
        )
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from None
    except pd.errors.ParserError as exc:
        raise DataError(f"not a valid CSV file ({str(exc).splitlines()[0]})", path=path) from None


def _flag_text(values: pd.Series) -> pd.Series:
    """H&M's FN/Active flags are 1.0 or empty: keep them as categorical text ('1'), missing as missing."""
    text = values.astype("string").str.strip()
    return text.str.replace(r"^(\d+)\.0+$", r"\1", regex=True)


def _customers(source: Path) -> tuple[pd.DataFrame, int]:
    raw = _read_csv(source / CUSTOMERS, CUSTOMER_COLUMNS)
    raw = raw.dropna(subset=["customer_id"])
    deduplicated = raw.drop_duplicates("customer_id")
    customers = pd.DataFrame(
        {
            "customer_id": deduplicated["customer_id"].str.strip(),
            "age": pd.to_numeric(deduplicated["age"], errors="coerce").astype("float64"),
            "club_member_status": deduplicated["club_member_status"],
            "fashion_news_frequency": deduplicated["fashion_news_frequency"],
            "FN": _flag_text(deduplicated["FN"]),
            "Active": _flag_text(deduplicated["Active"]),
            "postal_code": deduplicated["postal_code"],
        }
    )
    return customers.reset_index(drop=True), len(raw) - len(deduplicated)


def _transactions(source: Path) -> tuple[pd.DataFrame, int]:
    raw = _read_csv(source / TRANSACTIONS, TRANSACTION_COLUMNS)
    tx = pd.DataFrame(
        {
            "customer_id": raw["customer_id"].str.strip(),
            "date": pd.to_datetime(raw["t_dat"], errors="coerce", format="%Y-%m-%d"),
            "article_id": normalize_article_ids(raw["article_id"]),
            "price": pd.to_numeric(raw["price"], errors="coerce"),
        }
    )
    malformed = tx[["customer_id", "date", "article_id"]].isna().any(axis=1)
    return tx[~malformed].reset_index(drop=True), int(malformed.sum())


def _articles(source: Path, tx: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    raw = _read_csv(source / ARTICLES, ("article_id", *ARTICLE_COLUMNS.values(), *EXTRA_ARTICLE_COLUMNS))
    raw["article_id"] = normalize_article_ids(raw["article_id"])
    raw = raw.dropna(subset=["article_id"]).drop_duplicates("article_id")
    mean_price = tx.dropna(subset=["price"]).groupby("article_id")["price"].mean()
    articles = pd.DataFrame({"article_id": raw["article_id"]})
    for ours, theirs in ARTICLE_COLUMNS.items():
        articles[ours] = raw[theirs].str.strip()
    articles["price"] = raw["article_id"].map(mean_price).astype("float64")
    for column in EXTRA_ARTICLE_COLUMNS:
        articles[column] = raw[column]
    priced = articles["price"].notna()  # an article never sold (or only at unreadable prices) has no price
    counts = {"articles_in_source": len(raw), "articles_without_price_dropped": int((~priced).sum())}
    return articles[priced].reset_index(drop=True), counts


def _baskets(tx: pd.DataFrame, customers: set, articles: set, cfg: ImportHMConfig,
             max_items: int) -> tuple[pd.DataFrame, dict]:
    """Distinct articles per (customer, day); kept when min..max items and every reference is known."""
    items = tx[["customer_id", "date", "article_id"]].drop_duplicates()
    items = items.sort_values(["customer_id", "date", "article_id"])
    items["known_article"] = items["article_id"].isin(articles)
    by_basket = items.groupby(["customer_id", "date"], sort=False)
    baskets = by_basket.agg(size=("article_id", "size"), all_known=("known_article", "all")).reset_index()
    reason = np.select(
        [
            baskets["size"] < cfg.min_items,
            baskets["size"] > max_items,
            ~baskets["customer_id"].isin(customers),
            ~baskets["all_known"],
        ],
        ["too_small", "too_large", "unknown_customer", "unknown_article"],
        default="kept",
    )
    kept_keys = baskets.loc[reason == "kept", ["customer_id", "date"]]
    kept_items = items.merge(kept_keys, on=["customer_id", "date"], how="inner", sort=False)
    outfits = kept_items.groupby(["customer_id", "date"], sort=True)["article_id"].agg(list).reset_index()
    day = outfits["date"].dt.strftime("%Y-%m-%d")
    outfits = pd.DataFrame(
        {
            "outfit_id": outfits["customer_id"] + "_" + day,  # deterministic: one outfit per customer and day
            "customer_id": outfits["customer_id"],
            "article_ids": outfits["article_id"],
            "date": day,
        }
    )
    counted = pd.Series(reason).value_counts()
    dropped = {r: int(counted.get(r, 0)) for r in ("too_small", "too_large", "unknown_customer", "unknown_article")}
    return outfits, {"baskets": len(baskets), "kept": int(counted.get("kept", 0)), "dropped": dropped}


def import_hm(source: Path, out_dir: Path, cfg: ImportHMConfig, max_set_size: int = ModelConfig().max_set_size) -> dict:
    """Read transactions_train.csv, customers.csv and articles.csv from `source`; write the raw contract
    (articles/customers/outfits.parquet, schema.json = HM_SCHEMA, ingest_report.json) into `out_dir`."""
    source, out_dir = Path(source), Path(out_dir)
    if not source.is_dir():
        raise DataError("H&M source folder not found", path=source)
    if cfg.min_items > max_set_size:
        raise DataError(f"import_hm.min_items ({cfg.min_items}) is above model.max_set_size ({max_set_size})")
    customers, duplicate_customers = _customers(source)
    tx, malformed_rows = _transactions(source)
    articles, article_counts = _articles(source, tx)
    outfits, basket_counts = _baskets(tx, set(customers["customer_id"]), set(articles["article_id"]), cfg, max_set_size)

    out_dir.mkdir(parents=True, exist_ok=True)
    articles.to_parquet(out_dir / "articles.parquet", index=False)
    customers.to_parquet(out_dir / "customers.parquet", index=False)
    outfit_table = pa.Table.from_pandas(outfits, preserve_index=False).cast(
        pa.schema([("outfit_id", pa.string()), ("customer_id", pa.string()),
                   ("article_ids", pa.list_(pa.string())), ("date", pa.string())])  # fmt: skip
    )
    pq.write_table(outfit_table, out_dir / "outfits.parquet")
    HM_SCHEMA.save(out_dir)
    report = {
        "source": "hm",
        "source_dir": str(source),
        "transactions": len(tx) + malformed_rows,
        "transactions_malformed_dropped": malformed_rows,
        "baskets": basket_counts["baskets"],
        "baskets_kept": basket_counts["kept"],
        "baskets_dropped": basket_counts["dropped"],
        "min_items": cfg.min_items,
        "max_items": max_set_size,
        **article_counts,
        "customers_duplicate_dropped": duplicate_customers,
        "rows": {"articles": len(articles), "customers": len(customers), "outfits": len(outfits)},
        "mapping": MAPPING_NOTE,
    }
    (out_dir / "ingest_report.json").write_text(json.dumps(report, indent=2))
    return report
