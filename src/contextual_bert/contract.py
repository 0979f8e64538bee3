"""The raw data contract: three Parquet tables under data/raw/ and a schema file beside them.

articles:  article_id (string), product_type, brand, color, style (strings), price (float > 0), more allowed.
customers: customer_id (string) + the customer's context columns.
outfits:   outfit_id (string), customer_id (string), article_ids (list of 4-8 distinct article_id strings)
           + per-outfit context columns (e.g. occasion).

Context columns are declared in `schema.json`, not hard-coded, so the synthetic data (the paper's features)
and imported data (H&M's) flow through the same validation and feature code.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

TABLES = ("articles", "customers", "outfits")
SCHEMA_FILE = "schema.json"

# Column -> logical type. "string" columns hold Python str; "list[string]" a list of str.
REQUIRED_COLUMNS: dict[str, dict[str, str]] = {
    "articles": {
        "article_id": "string",
        "product_type": "string",
        "brand": "string",
        "color": "string",
        "style": "string",
        "price": "float",
    },
    "customers": {"customer_id": "string"},
    "outfits": {"outfit_id": "string", "customer_id": "string", "article_ids": "list[string]"},
}
ID_COLUMN = {"articles": "article_id", "customers": "customer_id", "outfits": "outfit_id"}
MIN_OUTFIT_SIZE, MAX_OUTFIT_SIZE = 4, 8

ContextKind = Literal["categorical", "multi_categorical", "numeric"]
KIND_TO_TYPE = {"categorical": "string", "multi_categorical": "list[string]", "numeric": "float"}


@dataclass(frozen=True)
class ContextColumn:
    name: str
    table: Literal["customers", "outfits"]
    kind: ContextKind


@dataclass(frozen=True)
class DataSchema:
    """Which columns of customers/outfits are context, and of what kind."""

    source: str  # "synthetic" or "hm": where the data came from
    context_columns: tuple[ContextColumn, ...]

    def columns_of(self, table: str) -> dict[str, str]:
        """All columns a table must have: the required ones and its declared context columns."""
        cols = dict(REQUIRED_COLUMNS[table])
        cols.update({c.name: KIND_TO_TYPE[c.kind] for c in self.context_columns if c.table == table})
        return cols

    def save(self, directory: Path) -> Path:
        path = Path(directory) / SCHEMA_FILE
        payload = {"source": self.source, "context_columns": [asdict(c) for c in self.context_columns]}
        path.write_text(json.dumps(payload, indent=2))
        return path

    @classmethod
    def load(cls, directory: Path) -> "DataSchema":
        from contextual_bert.errors import DataError

        path = Path(directory) / SCHEMA_FILE
        if not path.exists():
            raise DataError("schema file not found (it declares the context columns)", path=path)
        try:
            payload = json.loads(path.read_text())
            columns = tuple(ContextColumn(**c) for c in payload["context_columns"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DataError(f"not a valid schema file ({exc})", path=path) from None
        return cls(source=payload.get("source", "unknown"), context_columns=columns)


# The paper's customer context (Denk & Peleteiro Ramallo, 2020, sec. 4): what the generator writes.
PAPER_SCHEMA = DataSchema(
    source="synthetic",
    context_columns=(
        ContextColumn("age", "customers", "numeric"),
        ContextColumn("gender", "customers", "categorical"),
        ContextColumn("country", "customers", "categorical"),
        ContextColumn("preferred_brands", "customers", "multi_categorical"),
        ContextColumn("preferred_colors", "customers", "multi_categorical"),
        ContextColumn("preferred_styles", "customers", "multi_categorical"),
        ContextColumn("nogo_product_types", "customers", "multi_categorical"),
        ContextColumn("size_top", "customers", "categorical"),
        ContextColumn("size_bottom", "customers", "categorical"),
        ContextColumn("size_shoes", "customers", "categorical"),
        ContextColumn("price_min", "customers", "numeric"),
        ContextColumn("price_max", "customers", "numeric"),
        ContextColumn("occasion", "outfits", "categorical"),
    ),
)

# H&M Kaggle customers.csv columns kept as context.
HM_SCHEMA = DataSchema(
    source="hm",
    context_columns=(
        ContextColumn("age", "customers", "numeric"),
        ContextColumn("club_member_status", "customers", "categorical"),
        ContextColumn("fashion_news_frequency", "customers", "categorical"),
        ContextColumn("FN", "customers", "categorical"),
        ContextColumn("Active", "customers", "categorical"),
        ContextColumn("postal_code", "customers", "categorical"),
    ),
)
