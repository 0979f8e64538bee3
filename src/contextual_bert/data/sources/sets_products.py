"""The curated sets' products table: its columns as article columns (import_sets.articles), Polyvore's item metadata too."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from contextual_bert.config import ImportSetsConfig
from contextual_bert.data.contract import SOURCE_LINE, UNREAD_COLUMNS, open_binary, read_rows, text_suffix
from contextual_bert.errors import DataError

POLYVORE_SUFFIX = ".json"


def _read_json(path: Path):
    """A (possibly gzipped) JSON file's value; a file that is not UTF-8 or not JSON is a one-line DataError."""
    try:
        with open_binary(path) as f:
            return json.loads(f.read().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from None
    except json.JSONDecodeError as exc:
        raise DataError(f"not valid JSON (line {exc.lineno}: {exc.msg})", path=path) from None


def _text(values: pd.Series) -> pd.Series:
    """Ids as stripped text; None for missing or empty (a number read from JSON becomes its text)."""
    text = values.astype(object).where(values.notna(), None).map(lambda v: None if v is None else str(v).strip())
    return text.where(text.fillna("").str.len() > 0, None)


NAME_SEPARATORS = re.compile(r"[^0-9a-z]+")


def article_name(column: str) -> str:
    """A products table's column as the articles table names it: letter case folded, every run of spaces,
    '-', '.', '/' (anything not a letter or digit) one '_', none at the ends ("Product-Type " -> product_type)."""
    return NAME_SEPARATORS.sub("_", str(column).strip().casefold()).strip("_")


def _polyvore_products(path: Path, id_column: str) -> pd.DataFrame:
    """The Polyvore item metadata (an object keyed by item id, each value the item's fields) or a list of
    objects holding `id_column`, as rows (SOURCE_LINE: the entry's place, from 1)."""
    entries = _read_json(path)
    if isinstance(entries, dict):
        entries = [{id_column: key, **value} if isinstance(value, dict) else {id_column: key}
                   for key, value in entries.items()]  # fmt: skip
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise DataError("expected the item metadata layout: an object keyed by item id (or a list of objects)",
                        path=path)  # fmt: skip
    frame = pd.DataFrame(entries, dtype=object)
    frame[SOURCE_LINE] = np.arange(len(frame), dtype=np.int64) + 1
    return frame


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_))


def _product_column(values: pd.Series) -> pa.Array:
    """One column of the products table as the articles table holds it: numbers as float64, lists as lists of
    text, except lists of numbers holding a float (a vector: an image's or a text's embedding) as lists of
    float32; anything else as stripped text (empty -> null; an object as its JSON)."""
    cells = [None if not isinstance(c, (list, tuple, np.ndarray)) and pd.isna(c) else c for c in values.tolist()]
    present = [c for c in cells if c is not None]
    if present and all(isinstance(c, (list, tuple, np.ndarray)) for c in present):
        flat = [v for c in present for v in c]
        if flat and all(_is_number(v) for v in flat) and any(isinstance(v, (float, np.floating)) for v in flat):
            return pa.array([None if c is None else [float(v) for v in c] for c in cells], pa.list_(pa.float32()))
        return pa.array([None if c is None else [str(v) for v in c] for c in cells], pa.list_(pa.string()))
    if present and all(_is_number(c) for c in present):
        return pa.array([None if c is None else float(c) for c in cells], pa.float64())
    text = [None if c is None else (json.dumps(c) if isinstance(c, dict) else str(c).strip()) for c in cells]
    return pa.array([t or None for t in text], pa.string())


def read_products(cfg: ImportSetsConfig) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The products table (`import_sets.articles`): (its usable rows, one per id in the file's order, as
    article_id + the columns by their article names (article_name, or import_sets.article_columns); the lines
    that cannot be used: line, column, reason, text; counts)."""
    assert cfg.articles is not None, "read_products reads import_sets.articles"
    path = Path(cfg.articles)
    id_column = cfg.article_id_column or cfg.item_column
    if text_suffix(path) == POLYVORE_SUFFIX:
        if not path.is_file():
            raise DataError("file not found", path=path)
        frame, unread = _polyvore_products(path, id_column), pd.DataFrame(columns=UNREAD_COLUMNS)
    else:
        frame, unread = read_rows(path, (id_column,))
    if id_column not in frame.columns:
        raise DataError("the products' id column is missing (import_sets.article_id_column)", path=path,
                        column=id_column)  # fmt: skip
    theirs = [c for c in frame.columns if c not in (SOURCE_LINE, id_column)]
    names = {c: article_name(c) for c in theirs}
    for ours, column in cfg.article_columns.items():
        if column not in names:
            raise DataError(f"import_sets.article_columns maps {ours} to a column the products table does not have "
                            f"(it has {theirs})", path=path, column=column)  # fmt: skip
        names[column] = ours
    seen: dict[str, str] = {}
    for column, name in names.items():
        if name == "article_id" or not name:
            raise DataError(f"a products column read as '{name}' clashes with the article id", path=path,
                            column=column)  # fmt: skip
        if name in seen:
            raise DataError(f"two products columns are both read as '{name}' ('{seen[name]}' and '{column}'); "
                            "rename one with import_sets.article_columns", path=path, column=column)  # fmt: skip
        seen[name] = column
    ids = _text(frame[id_column])
    duplicate = ids.notna() & ids.duplicated()
    bad = (ids.isna() | duplicate).to_numpy()
    quarantine = pd.DataFrame({
        "line": frame[SOURCE_LINE][bad].astype("int64"), "column": id_column,
        "reason": np.where(ids[bad].isna(), "no article id", "article id listed before"),
        "text": [",".join("" if v is None or (np.ndim(v) == 0 and pd.isna(v)) else str(v) for v in row)
                 for row in frame.loc[bad, [c for c in frame.columns if c != SOURCE_LINE]].itertuples(index=False)],
    })  # fmt: skip
    rows = pd.DataFrame({"article_id": ids[~bad].tolist()}
                        | {names[c]: frame.loc[~bad, c].tolist() for c in theirs}, dtype=object)  # fmt: skip
    counts = {
        "rows": int(len(frame) + len(unread)),
        "without_id": int(ids.isna().sum()),
        "duplicate_id": int(duplicate.sum()),
        "lines_rejected": len(unread),
        "columns": {c: names[c] for c in theirs},
    }
    return rows, pd.concat([unread, quarantine], ignore_index=True), counts
