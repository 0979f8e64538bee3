"""Article vectors from files of their own (ingest.article_vectors): after any source's ingest, each file is joined
into data/raw/articles.parquet as a list<float32> column named after its attribute, so that validation and the
features stage read it as they read any column of the articles table (a source's own list column, as a products
table's or the planted source's, the same way: data/vectors.py).

A file is Parquet, with an id column and a list column (named in any letter case), or .npy, an (articles,
length) array of numbers, with its ids in a text file beside it, one a line, row for row. An id matches an
article as serving matches one a client typed (ArticleVocab.to_indices: without surrounding spaces, or by its
value where it is a whole number: H&M's ids written as integers find their 10 digits).

A row that cannot be joined goes to the import quarantine (contract.IMPORT_QUARANTINE: file, line = the row from
1, column, reason, text): no article id, an id the articles table does not have, an id listed before, no vector,
or a bad one (vectors.read_vectors: another length than most, a missing, NaN or infinite value, no list of
numbers). ingest_report.json counts per attribute: rows = joined + quarantined (by reason), and the articles
left without a vector (they stay, and read the model's missing vector). A file none of whose rows can be joined
is an error naming its first bad row; so are a missing or unreadable file or column, and an attribute that is a
column of the articles table already.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from contextual_bert.config_sources import VectorFileConfig
from contextual_bert.data.contract import IMPORT_QUARANTINE, column_names, write_import_quarantine
from contextual_bert.data.feature_spec import N_SPECIAL, UNKNOWN_INDEX
from contextual_bert.data.vectors import read_vectors, vector_array
from contextual_bert.errors import DataError

ARTICLES_FILE = "articles.parquet"
REPORT_FILE = "ingest_report.json"
NO_ID, NOT_IN_ARTICLES, LISTED_BEFORE, NO_VECTOR = (
    "no article id", "no such article in the articles table", "article id listed before", "no vector",
)  # fmt: skip


def vector_inputs(cfg) -> list[Path]:
    """The files ingest.article_vectors names (a .npy's ids file too), for the `source` stage's fingerprint;
    a missing one is a DataError."""
    paths = []
    for setting in cfg.ingest.article_vectors.values():
        paths += [setting.path, setting.ids_path] if setting.path.suffix == ".npy" else [setting.path]
    for path in paths:
        if not path.is_file():
            raise DataError("file not found (ingest.article_vectors)", path=path)
    return paths


def _text_ids(values) -> np.ndarray:
    """Ids as stripped text, None where there is none (a number read from a file becomes its text)."""
    text = [None if v is None or (isinstance(v, float) and np.isnan(v)) else str(v).strip() for v in values]
    return np.array([t or None for t in text], dtype=object)


def _read_npy(setting: VectorFileConfig) -> tuple[np.ndarray, np.ndarray]:
    try:
        matrix = np.load(setting.path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise DataError(f"not a readable .npy file ({str(exc).splitlines()[0]})", path=setting.path) from None
    if matrix.ndim != 2 or matrix.dtype.kind not in "fiu":
        raise DataError(f"expected an (articles, length) array of numbers, found {matrix.dtype} of shape "
                        f"{matrix.shape}", path=setting.path)  # fmt: skip
    try:
        lines = setting.ids_path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=setting.ids_path) from None
    if len(lines) != len(matrix):
        raise DataError(f"{len(lines)} ids for the {len(matrix)} rows of {setting.path.name}", path=setting.ids_path)
    return _text_ids(lines), matrix


def _read_parquet(setting: VectorFileConfig) -> tuple[np.ndarray, pa.Array]:
    try:
        table = pq.read_table(setting.path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"not a readable Parquet file ({str(exc).splitlines()[0]})", path=setting.path) from None
    table = table.rename_columns(column_names(table.column_names, (setting.id_column, setting.column)))
    for column in (setting.id_column, setting.column):
        if column not in table.column_names:
            raise DataError(f"column not found (ingest.article_vectors); the file has {table.column_names}",
                            path=setting.path, column=column)  # fmt: skip
    vectors = table.column(setting.column)
    vectors = vectors.combine_chunks() if vectors.num_chunks else pa.array([], vectors.type)
    return _text_ids(table.column(setting.id_column).to_pylist()), vectors


def _row_text(article_id, values, row: int) -> str:
    """A quarantined row as its values joined by commas: the id, then the vector's numbers."""
    cell = values[row].as_py() if isinstance(values, pa.Array) else values[row].tolist()
    numbers = ",".join(str(v) for v in cell) if isinstance(cell, list) else ("" if cell is None else str(cell))
    return f"{article_id or ''},{numbers}"


def join_file(name: str, setting: VectorFileConfig, article_ids: list[str]) -> tuple[pa.Array, pd.DataFrame, dict]:
    """(the articles' column of vectors, in the articles table's order, null for none; the file's rows that are
    not joined, as import quarantine rows; the counts)."""
    # (these import torch: only when vectors are joined)
    from contextual_bert.data.feature_store import SPECIAL_ARTICLES
    from contextual_bert.data.vocabularies import ArticleVocab

    npy = setting.path.suffix == ".npy"
    ids, values = _read_npy(setting) if npy else _read_parquet(setting)
    vectors = read_vectors(values)
    vocab = ArticleVocab([*SPECIAL_ARTICLES, *article_ids], np.zeros(N_SPECIAL + len(article_ids), np.int64))
    index, _ = vocab.to_indices(np.where(pd.isna(ids), "", ids), as_written=False)
    no_id = pd.isna(ids)
    unknown = ~no_id & (index == UNKNOWN_INDEX)
    repeated = ~no_id & ~unknown & pd.Series(index).duplicated().to_numpy()
    # one reason per row, an id's fault before its vector's (later assignments win)
    reasons = vectors.reasons.copy()  # a bad vector's; None where it is fine or absent
    reasons[vectors.missing & pd.isna(reasons)] = NO_VECTOR
    reasons[repeated] = LISTED_BEFORE
    reasons[unknown] = NOT_IN_ARTICLES
    reasons[no_id] = NO_ID
    bad = np.flatnonzero(pd.notna(reasons))
    id_reason = np.isin(reasons[bad], [NO_ID, NOT_IN_ARTICLES, LISTED_BEFORE])  # a .npy's ids are in its ids file
    quarantine = pd.DataFrame({
        "file": np.where(id_reason & npy, setting.ids_path.name, setting.path.name),
        "line": bad + 1,
        "column": None if npy else np.where(id_reason, setting.id_column, setting.column),
        "reason": reasons[bad].astype(str),
        "text": [_row_text(ids[row], values, row) for row in bad.tolist()],
    })  # fmt: skip
    joined = np.flatnonzero(pd.isna(reasons))
    if not len(joined):
        first = quarantine.iloc[0] if len(quarantine) else None
        why = f"row {first['line']}: {first['reason']}; " if first is not None else ""
        raise DataError(f"{why}no row of the file can be joined to an article (ingest.article_vectors.{name})",
                        path=setting.path)  # fmt: skip
    matrix = np.full((len(article_ids), vectors.length), np.nan, dtype=np.float32)
    matrix[index[joined] - N_SPECIAL] = vectors.matrix[joined]
    counts = {
        "file": str(setting.path),
        "length": vectors.length,
        "rows": len(ids),
        "joined": len(joined),
        "quarantined": {str(r): int(n) for r, n in zip(*np.unique(reasons[bad].astype(str), return_counts=True))},
        "articles_without_vector": len(article_ids) - len(joined),
    }
    return vector_array(matrix), quarantine, counts


def join_article_vectors(cfg, report: dict) -> dict:
    """Join every file of ingest.article_vectors into the raw articles table (module docstring); the ingest
    report with their counts under `article_vectors` (as written to ingest_report.json). Without any: nothing
    read or written, the report as it was."""
    if not cfg.ingest.article_vectors:
        return report
    raw_dir = Path(cfg.paths.raw_dir)
    articles = pq.read_table(raw_dir / ARTICLES_FILE)
    article_ids = [str(a) for a in articles.column("article_id").to_pylist()]
    parts, counts = [], {}
    for name, setting in cfg.ingest.article_vectors.items():
        if name in articles.column_names:
            raise DataError(f"ingest.article_vectors.{name} is a column of the articles table already: name the "
                            "vectors otherwise", path=raw_dir / ARTICLES_FILE, column=name)  # fmt: skip
        column, quarantine, counts[name] = join_file(name, setting, article_ids)
        articles = articles.append_column(name, column)
        parts.append(quarantine)
    pq.write_table(articles, raw_dir / ARTICLES_FILE)
    report = {**report, "article_vectors": counts}
    if any(len(part) for part in parts):  # beside the source's own quarantined lines, if any
        quarantine_path = raw_dir / IMPORT_QUARANTINE
        if quarantine_path.exists():
            parts.insert(0, pq.read_table(quarantine_path).to_pandas())
        quarantined = write_import_quarantine(pd.concat(parts, ignore_index=True), raw_dir)
        report["quarantined"] = {"file": IMPORT_QUARANTINE, "rows": quarantined}
    (raw_dir / REPORT_FILE).write_text(json.dumps(report, indent=2))
    return report
