"""Import curated sets (outfits made by people, not baskets) into the raw data contract.

Input (`import_sets.source`), by its suffix (a text file may be gzipped: `.csv.gz`, `.jsonl.gz`, `.json.gz`):
- `.csv` (or `.tsv`), `.parquet`, `.jsonl`: pairs, one row per (outfit, item): columns `outfit_column` and
  `item_column`, and optionally `customer_column`, the outfit's customer (one per outfit). In a Parquet or
  JSON-lines file the item column may instead hold each set's items as a list, one row per set (layout
  "item_lists"; a row may also hold one item, and rows of one set add up).
- `.json`: the Polyvore Outfits layout, a list of sets, each `{"set_id": ..., "items": [{"item_id": ...}, ...]}`
  (other keys, such as an item's "index", are ignored); an item may also be its id alone (`"items": ["a", "b"]`),
  and the sets may be an object keyed by set id (`{"<set_id>": {"items": [...]}}` or `{"<set_id>": [...]}`).
An item listed twice in a set counts once (the first place it is listed); sets with fewer than
`ingest.min_set_size` or more than `model.max_set_size` distinct items are dropped and counted (sets = kept +
dropped); a pair without an outfit or item id is dropped, counted and written to the import quarantine
(contract.IMPORT_QUARANTINE) with its line, and so is a CSV line (of the pairs or the customers file) that
cannot be read: the rest of the file imports. A CSV may be separated by any of contract.DELIMITERS. Items keep
the order the set lists them in.

Customers are optional. Without `customer_column` every outfit has no customer (customer_id null); with it
but without a customers table, or for a customer the table lacks, the customer's context is missing. The
customers table (`import_sets.customers`, .csv / .parquet / .jsonl, keyed by `customer_column`) brings the
context columns declared in `import_sets.context` (categorical, multi_categorical, numeric); validation
types and checks them. Without context, only the models that read no context and the popularity yardstick run (see report.py).

Products are optional too (`import_sets.articles`): a products table (.csv/.tsv, .parquet, .jsonl; or .json, the
Polyvore item metadata, an object keyed by item id whose values are the item's fields; or a list of objects), keyed
by `import_sets.article_id_column` (default: item_column). Every column becomes a column of the articles table,
named as the contract spells it (`article_name`: letter case, spaces, '-' and '.' do not matter: "Product Type",
"product-type" and "PRODUCT_TYPE" are product_type), or as `import_sets.article_columns` maps it (attribute ->
the table's column, for names that differ otherwise: color <- "Colour"); features.article_attributes.sets
declares which of them the models read, and their kinds (text for a title or description). A number column stays
numeric; a list column (a JSON or Parquet list) a list of text. An outfit item without a product row keeps its
outfit, its attributes missing (counted: items_without_product); a product row without outfits is an article
all the same (the attribute models rank it; counted: products_without_outfit); a product line without an id,
an id listed twice (after the first), or a line that cannot be read goes to the import quarantine.
Without a products table, articles get one row per item, their attributes (product_type, brand, color, style,
price) missing.

Dates are optional (`import_sets.date_column`, a column of the pairs or a key of a Polyvore set): a date (ISO,
2020-09-21) or an integer sequence number k, read as the day 1970-01-01 + k (only the order matters: an outfit's
history is its customer's earlier outfits, history.py). An outfit takes the date its rows give (a row without
one takes its outfit's); an outfit whose rows disagree on the date, with a date that is neither, or with none
at all is dropped (counted: sets_dropped.date) and every one of its pairs goes to the import quarantine with
the reason. Without `date_column` the outfits have no date column.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contextual_bert.config import ImportSetsConfig, IngestConfig, ModelConfig
from contextual_bert.data.contract import (
    DATE_COLUMN,
    DATE_TYPE,
    DELIMITED_SUFFIXES,
    IMPORT_QUARANTINE,
    REQUIRED_COLUMNS,
    SOURCE_LINE,
    UNREAD_COLUMNS,
    ContextColumn,
    DataSchema,
    parse_dates,
    read_rows,
    text_suffix,
    write_import_quarantine,
)
from contextual_bert.data.sources.sets_products import (  # noqa: F401
    NAME_SEPARATORS,
    POLYVORE_SUFFIX,
    _polyvore_products,
    _product_column,
    _read_json,
    _text,
    article_name,
    read_products,
)
from contextual_bert.errors import DataError

SOURCE_NAME = "sets"
SEQUENCE_START = np.datetime64("1970-01-01", "D")  # an integer date k is the day SEQUENCE_START + k
DATE_FORMS = "a date (YYYY-MM-DD) or an integer sequence number"
DATE_REASONS = {
    "unreadable": f"not a date ({DATE_FORMS})",
    "other_unreadable": "another row of its outfit has no readable date",
    "disagree": "the outfit's rows disagree on the date",
    "none": "the outfit has no date",
}


def sets_schema(cfg: ImportSetsConfig) -> DataSchema:
    """The context columns the customers table brings, as params declare them (all may be missing)."""
    columns = tuple(ContextColumn(name, "customers", kind) for name, kind in cfg.context.items()) if cfg.customers \
        else ()  # fmt: skip
    return DataSchema(source=SOURCE_NAME, context_columns=columns)


def _polyvore_pairs(path: Path, date_key: str | None = None) -> pd.DataFrame:
    sets = _read_json(path)
    if isinstance(sets, dict):  # keyed by set id: {id: {"items": [...]}} or {id: [...]}
        sets = [{**value, "set_id": key} if isinstance(value, dict) else {"set_id": key, "items": value}
                for key, value in sets.items()]  # fmt: skip
    if not isinstance(sets, list):
        raise DataError("expected the Polyvore Outfits layout: a list of sets with set_id and items", path=path)
    outfits, items, lines, dates = [], [], [], []
    for row, entry in enumerate(sets):
        if not isinstance(entry, dict) or "set_id" not in entry or not isinstance(entry.get("items"), list):
            raise DataError("a set needs 'set_id' and a list 'items'", path=path, row=row)
        for item in entry["items"]:
            if isinstance(item, dict) and "item_id" in item:
                item = item["item_id"]
            elif isinstance(item, (dict, list)):
                raise DataError("an item of a set must be its id or an object with 'item_id'", path=path, row=row,
                                column="items")  # fmt: skip
            outfits.append(entry["set_id"])
            items.append(item)
            lines.append(row + 1)
            dates.append(entry.get(date_key) if date_key else None)
    pairs = pd.DataFrame({"outfit_id": outfits, "item_id": items, "customer_id": None, "line": lines}, dtype=object)
    if date_key:
        pairs.insert(3, DATE_COLUMN, pd.Series(dates, dtype=object))
    return pairs


def read_pairs(path: Path, cfg: ImportSetsConfig) -> tuple[pd.DataFrame, str, pd.DataFrame]:
    """(outfit_id, item_id, customer_id, line) per pair, as listed (line: where in the file, as the import
    quarantine counts); the layout read ("pairs" / "polyvore"); and the lines that could not be read."""
    path = Path(path)
    if text_suffix(path) == POLYVORE_SUFFIX:
        if not path.is_file():
            raise DataError("file not found", path=path)
        return _polyvore_pairs(path, cfg.date_column), "polyvore", pd.DataFrame(columns=UNREAD_COLUMNS)
    wanted = {"outfit_id": cfg.outfit_column, "item_id": cfg.item_column}
    if cfg.customer_column:
        wanted["customer_id"] = cfg.customer_column
    if cfg.date_column:
        wanted[DATE_COLUMN] = cfg.date_column
    frame, unread = read_rows(path, tuple(wanted.values()), also=(POLYVORE_SUFFIX,))
    for column in wanted.values():
        if column not in frame.columns:
            raise DataError("required column missing (see import_sets.*_column)", path=path, column=column)
    pairs = pd.DataFrame({ours: frame[theirs] for ours, theirs in wanted.items()})
    if "customer_id" not in pairs:
        pairs["customer_id"] = None
    pairs = pairs[["outfit_id", "item_id", "customer_id", *([DATE_COLUMN] if cfg.date_column else [])]]
    pairs["line"] = frame[SOURCE_LINE]
    exploded = None if text_suffix(path) in DELIMITED_SUFFIXES else _item_lists(pairs)  # text cells: no lists
    return (pairs, "pairs", unread) if exploded is None else (exploded, "item_lists", unread)


def set_days(values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(day number since 1970-01-01, present, readable) per value: an integer (or its digits as text) is a
    sequence number k, the day 1970-01-01 + k; anything else is read as a date (contract.parse_dates)."""
    values = pd.Series(values, dtype=object).reset_index(drop=True)

    def integer(v):
        if isinstance(v, (bool, np.bool_)):
            return None
        if isinstance(v, (int, np.integer)) or (isinstance(v, (float, np.floating)) and float(v).is_integer()):
            return int(v)
        return int(v) if isinstance(v, str) and re.fullmatch(r"\s*-?\d{1,7}\s*", v) else None

    sequence = values.map(integer)
    is_sequence = sequence.notna().to_numpy()
    dates, present, ok = parse_dates(values.where(~is_sequence, None))
    days = pc.fill_null(dates.cast(pa.int32()), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    days = np.where(is_sequence, sequence.fillna(0).to_numpy(dtype=np.int64), days)
    return days, present | is_sequence, ok | is_sequence


def _date_faults(pairs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair: its day number, and the DATE_REASONS key of its outfit's fault ('' where the outfit's date is
    one day); and whether the pair's own date is the unreadable one."""
    days, present, ok = set_days(pairs[DATE_COLUMN])
    unreadable = present & ~ok
    usable = present & ok
    codes, _ = pd.factorize(pairs["outfit_id"], sort=False)
    n = codes.max(initial=-1) + 1
    any_unreadable = np.bincount(codes, unreadable, minlength=n) > 0
    distinct = pd.Series(days[usable]).groupby(codes[usable]).nunique().reindex(range(n), fill_value=0).to_numpy()
    fault = np.select([any_unreadable, distinct > 1, distinct == 0], ["other_unreadable", "disagree", "none"], "")
    reason = np.where(unreadable, "unreadable", fault[codes])
    return days, reason, usable


def _item_lists(pairs: pd.DataFrame) -> pd.DataFrame | None:
    """Rows holding a set's items as a list (Parquet, JSON lines) as pairs, one per item, each with its row's
    line; None when no cell holds a list. An empty list is a pair without an item id (quarantined)."""
    listed = pairs["item_id"].map(lambda v: isinstance(v, (list, tuple, np.ndarray)))
    if not listed.any():
        return None
    pairs = pairs.assign(item_id=[list(v) if is_list else [v] for v, is_list in zip(pairs["item_id"], listed)])
    return pairs.explode("item_id", ignore_index=True)


def _multi_values(cells: list, as_text: bool) -> pa.Array:
    """Lists (of anything) as lists of text; when some cells are text ("a|b" or a JSON list), all as text."""
    cells = [c if c is None or isinstance(c, str) else [str(v) for v in c] for c in cells]
    if as_text:
        return pa.array([c if c is None or isinstance(c, str) else json.dumps(c) for c in cells], pa.string())
    return pa.array(cells, pa.list_(pa.string()))


def _customers(cfg: ImportSetsConfig) -> tuple[pa.Table, pd.DataFrame]:
    """The customers table: its key and the declared context columns (values as read; validation types them);
    and the file's lines that could not be read."""
    if cfg.customers is None:
        if cfg.context:
            raise DataError("import_sets.context declares columns but import_sets.customers names no table")
        return pa.table({"customer_id": pa.array([], pa.string())}), pd.DataFrame(columns=UNREAD_COLUMNS)
    if not cfg.customer_column:
        raise DataError("import_sets.customers is set but import_sets.customer_column is not: outfits would "
                        "name no customer")  # fmt: skip
    frame, unread = read_rows(cfg.customers, (cfg.customer_column,), tuple(cfg.context))
    for column in (cfg.customer_column, *cfg.context):
        if column not in frame.columns:
            raise DataError("column missing (declared in import_sets)", path=cfg.customers, column=column)
    columns = {"customer_id": pa.array(_text(frame[cfg.customer_column]).tolist(), pa.string())}
    for name, kind in cfg.context.items():
        values = frame[name].astype(object).where(frame[name].notna(), None)
        as_text = values.map(lambda v: isinstance(v, str)).any()  # text: validation parses it, row by row
        if kind == "categorical":  # codes written as numbers are categories all the same
            columns[name] = pa.array(_text(values).tolist(), pa.string())
        elif kind == "numeric":
            columns[name] = pa.array(values.tolist(), pa.string() if as_text else pa.float64())
        else:
            columns[name] = _multi_values(values.tolist(), as_text)
    return pa.table(columns), unread


def _articles_table(items: pa.Array, cfg: ImportSetsConfig) -> tuple[pa.Table, pd.DataFrame, dict]:
    """The articles table: every outfit item (in the order first listed), then the products table's other rows;
    the contract's columns (null where the products table lacks them) and the products table's columns. Also the
    products lines that cannot be used (quarantine) and counts."""
    columns = {"article_id": items}
    unusable, counts = pd.DataFrame(columns=UNREAD_COLUMNS), dict[str, int]()
    if cfg.articles is not None:
        products, unusable, counts = read_products(cfg)
        item_ids = items.to_pylist()
        in_outfits = set(item_ids)
        others = [a for a in products["article_id"] if a not in in_outfits]
        rows = products.set_index("article_id").reindex(item_ids + others)
        columns = {"article_id": pa.array(item_ids + others, pa.string())}
        columns |= {name: _product_column(rows[name]) for name in rows.columns}
        counts |= {
            "items_without_product": len(in_outfits - set(products["article_id"])),
            "products_without_outfit": len(others),
        }
    n = len(columns["article_id"])
    for column, logical in REQUIRED_COLUMNS["articles"].items():  # the contract's: missing where not given
        if column not in columns:
            columns[column] = pa.nulls(n, pa.float64() if logical == "float" else pa.string())
        elif logical == "string" and pa.types.is_floating(columns[column].type):  # codes written as numbers
            columns[column] = pa.array([None if v is None else (str(int(v)) if float(v).is_integer() else str(v))
                                        for v in columns[column].to_pylist()], pa.string())  # fmt: skip
        elif logical == "float" and not pa.types.is_floating(columns[column].type):  # a price as text
            values = pd.to_numeric(pd.Series(columns[column].to_pylist(), dtype=object), errors="coerce")
            given = np.asarray(columns[column].is_valid().to_pylist(), dtype=bool)
            counts["price_not_a_number"] = int((values.isna().to_numpy() & given).sum())  # missing then
            columns[column] = pa.array(values.to_numpy(dtype=np.float64), pa.float64(), from_pandas=True)
    return pa.table(columns), unusable, counts


def import_sets(
    source: Path,
    out_dir: Path,
    cfg: ImportSetsConfig,
    max_set_size: int = ModelConfig().max_set_size,
    min_set_size: int = IngestConfig().min_set_size,
) -> dict:
    """Read curated sets from `source`; write the raw contract and ingest_report.json into `out_dir`."""
    source, out_dir = Path(source), Path(out_dir)
    pairs, layout, unread = read_pairs(source, cfg)
    customers, customers_unread = _customers(cfg)
    n_pairs = len(pairs)
    for column in ("outfit_id", "item_id", "customer_id"):
        pairs[column] = _text(pairs[column])
    malformed = pairs["outfit_id"].isna() | pairs["item_id"].isna()
    bad = pairs[malformed]
    names = ("set_id", "item_id") if layout == "polyvore" else (cfg.outfit_column, cfg.item_column)
    quarantine = pd.DataFrame({
        "file": source.name, "line": bad["line"].astype("int64"),
        "column": np.where(bad["outfit_id"].isna(), names[0], names[1]),
        "reason": np.where(bad["outfit_id"].isna(), "no outfit id", "no item id"),
        "text": [",".join("" if pd.isna(v) else str(v) for v in row) for row in bad[["outfit_id", "item_id", "customer_id"]]
                 .itertuples(index=False)],
    })  # fmt: skip
    quarantine = pd.concat(
        [unread.assign(file=source.name), quarantine]
        + (
            [customers_unread.assign(file=Path(cfg.customers).name)]
            if cfg.customers is not None and len(customers_unread)
            else []
        ),
        ignore_index=True,
    )
    pairs = pairs[~malformed]
    undated_sets = 0
    if cfg.date_column:  # an outfit without one readable date: every pair of it to the quarantine
        days, reason, usable = _date_faults(pairs)
        faulty = reason != ""
        undated_sets = pairs["outfit_id"][faulty].nunique()
        dropped = pairs[faulty]
        quarantine = pd.concat([quarantine, pd.DataFrame({
            "file": source.name, "line": dropped["line"].astype("int64"),
            "column": cfg.date_column,
            "reason": [DATE_REASONS[r] for r in reason[faulty]],
            "text": [",".join("" if pd.isna(v) else str(v) for v in row)
                     for row in dropped[["outfit_id", "item_id", "customer_id", DATE_COLUMN]].itertuples(index=False)],
        })], ignore_index=True)  # fmt: skip
        pairs = pairs.assign(**{DATE_COLUMN: np.where(usable, days, np.iinfo(np.int64).min)})[~faulty]
    unique = pairs.drop_duplicates(["outfit_id", "item_id"])  # keeps the first place an item is listed
    customers_per_outfit = unique.dropna(subset=["customer_id"]).groupby("outfit_id", sort=False)["customer_id"]
    conflicting = customers_per_outfit.nunique()
    if (conflicting > 1).any():
        outfit = conflicting.index[conflicting > 1][0]
        raise DataError(f"outfit '{outfit}' names {conflicting[outfit]} different customers (one per outfit)",
                        path=source, column=cfg.customer_column)  # fmt: skip
    # Each set's items as one Arrow list, by a stable sort on the order sets are first listed in: a groupby
    # into Python lists costs a Python call per set (30 s of 36 for 6M pairs, measured).
    codes, outfit_ids = pd.factorize(unique["outfit_id"], sort=False)
    sizes = np.bincount(codes, minlength=len(outfit_ids))
    too_small, too_large = sizes < min_set_size, sizes > max_set_size
    keep = ~too_small & ~too_large
    items_in_order = unique["item_id"].to_numpy()[np.argsort(codes, kind="stable")]
    lists = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(sizes)]), pa.int32()),
                                     pa.array(items_in_order, pa.string()))  # fmt: skip
    first_customer = unique["customer_id"].groupby(codes).first()  # the first named (nulls skipped)
    customer_ids = first_customer.reindex(np.flatnonzero(keep)).reset_index(drop=True)
    customer_ids = customer_ids.astype(object).where(customer_ids.notna(), None)

    outfits = pa.table({
        "outfit_id": pa.array(outfit_ids.to_numpy(dtype=object)[keep], pa.string()),
        "customer_id": pa.array(customer_ids.tolist(), pa.string()),
        "article_ids": lists.filter(pa.array(keep)),
    })  # fmt: skip
    if cfg.date_column:  # each outfit's one day (a row without a date holds the smallest int64: max skips it)
        day = pairs.groupby("outfit_id", sort=False)[DATE_COLUMN].max().reindex(outfit_ids[keep]).to_numpy()
        outfits = outfits.append_column(DATE_COLUMN, pa.array(SEQUENCE_START + day.astype("timedelta64[D]"), DATE_TYPE))
    items = pc.unique(outfits.column("article_ids").combine_chunks().flatten())  # in the order first listed
    articles, products_unusable, products_counts = _articles_table(items, cfg)
    if cfg.articles is not None and len(products_unusable):  # only a products table has lines it cannot use
        quarantine = pd.concat([quarantine, products_unusable.assign(file=Path(cfg.articles).name)], ignore_index=True)
    known_customers = set(customers.column("customer_id").to_pylist())

    out_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(outfits, out_dir / "outfits.parquet")
    pq.write_table(articles, out_dir / "articles.parquet")
    pq.write_table(customers, out_dir / "customers.parquet")
    quarantined = write_import_quarantine(quarantine, out_dir)
    sets_schema(cfg).save(out_dir)
    report = {
        "source": SOURCE_NAME,
        "file": str(source),
        "layout": layout,
        "pairs": n_pairs,
        "pairs_malformed_dropped": int(malformed.sum()),
        "lines_rejected": {
            source.name: len(unread),
            **({Path(cfg.customers).name: len(customers_unread)} if cfg.customers else {}),
        },
        "quarantined": {"file": IMPORT_QUARANTINE, "rows": quarantined},
        "pairs_duplicate_dropped": int(len(pairs) - len(unique)),
        "sets": len(outfit_ids) + undated_sets,
        "sets_kept": outfits.num_rows,
        "sets_dropped": {
            "too_small": int(too_small.sum()),
            "too_large": int(too_large.sum()),
            **({"date": int(undated_sets)} if cfg.date_column else {}),
        },
        "min_items": min_set_size,
        "max_items": max_set_size,
        "outfits_without_customer": int(customer_ids.isna().sum()),
        "outfits_without_customer_row": int((customer_ids.notna() & ~customer_ids.isin(known_customers)).sum()),
        "context_columns": dict(cfg.context) if cfg.customers else {},
        "rows": {"articles": articles.num_rows, "customers": customers.num_rows, "outfits": outfits.num_rows},
        **({"products": {"file": str(cfg.articles), **products_counts}} if cfg.articles else {}),
    }
    (out_dir / "ingest_report.json").write_text(json.dumps(report, indent=2))
    if not outfits.num_rows:  # the report stays for a look at why; an empty import is no result
        dropped = report["sets_dropped"]
        raise DataError(
            f"no outfit kept: of {len(outfit_ids)} sets none has {min_set_size}-{max_set_size} distinct items "
            f"({dropped['too_small']} too small, {dropped['too_large']} too large)",
            path=source,
        )
    return report


def ingest(cfg, source: Path | None = None) -> dict:
    """The `sets` entry of sources.SOURCES."""
    return import_sets(
        source or cfg.import_sets.source,
        out_dir=cfg.paths.raw_dir,
        cfg=cfg.import_sets,
        max_set_size=cfg.model.max_set_size,
        min_set_size=cfg.ingest.min_set_size,
    )


def schema(cfg) -> DataSchema:
    """The context columns of the `sets` source (sources.SOURCES)."""
    return sets_schema(cfg.import_sets)


def inputs(cfg) -> list[Path]:
    """The files the `sets` source reads (sources.SOURCES): the sets, and the customers and products tables when
    named."""
    paths = [
        Path(p) for p in (cfg.import_sets.source, cfg.import_sets.customers, cfg.import_sets.articles) if p is not None
    ]
    for path in paths:
        if not path.is_file():
            raise DataError("file not found", path=path)
    return paths
