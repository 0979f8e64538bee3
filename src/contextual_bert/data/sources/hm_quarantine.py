"""The H&M import's quarantine: the rows it cannot use, each with its reason, and their counts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from contextual_bert.data.contract import UNREADABLE
from contextual_bert.data.sources.hm_files import ARTICLES, CUSTOMERS, TRANSACTIONS, _Db, _SourceFile
from contextual_bert.errors import DataError

REJECTED = {
    "INVALID ENCODING": UNREADABLE["encoding"],
    "TOO MANY COLUMNS": UNREADABLE["too_many"],
    "MISSING COLUMNS": UNREADABLE["too_few"],
    "UNQUOTED VALUE": UNREADABLE["quote"],
}


UNUSABLE = {"customer_id": "no customer id", "t_dat": "not a date", "article_id": "no article id"}


def _date_reason(date_format: str | None) -> str:
    """Why a t_dat is no date, saying which forms are read."""
    if date_format is None:
        return f"{UNUSABLE['t_dat']} (YYYY-MM-DD, or an ISO date and time; another form: set import_hm.date_format)"
    return f"{UNUSABLE['t_dat']} (YYYY-MM-DD, an ISO date and time, or import_hm.date_format '{date_format}')"


def _lines(rows: np.ndarray, rejected: np.ndarray, header_lines: int) -> np.ndarray:
    """File lines (1 = a CSV's header) of the rows read, numbered 1..n in file order, around the sorted lines
    that were not read. A blank line (DuckDB skips it) or a quoted field over several lines before a row
    would shift its number; H&M's files have neither."""
    rows_before = rejected - 1 - header_lines - np.arange(len(rejected))  # rows read before each line not read
    return rows + header_lines + np.searchsorted(rows_before, rows, side="left")


def _quarantine(
    db: _Db, files: dict[str, _SourceFile], counts: dict, date_format: str | None
) -> tuple[pd.DataFrame, dict]:
    """Every source line the import could not use, once (contract.IMPORT_QUARANTINE_SCHEMA's columns), and
    the lines not read per file: lines DuckDB could not read, then rows read without a usable customer id,
    date or article id. A file of which nothing could be read, or transactions none of which are usable,
    are errors naming the first bad line."""
    (read_csv,) = db.one("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'reject_errors'")
    rejects = db.arrow("""SELECT s.file_path AS path, e.line, first(e.column_name) AS "column",
        first(e.error_type) AS error_type, first(e.error_message) AS message, first(e.csv_line) AS text
        FROM reject_errors e JOIN reject_scans s USING (scan_id, file_id) GROUP BY s.file_path, e.line
        ORDER BY s.file_path, e.line""").to_pandas() if read_csv else pd.DataFrame(  # Parquet files only
        columns=["path", "line", "column", "error_type", "message", "text"])  # fmt: skip
    rejects["file"] = rejects["path"].map(lambda p: Path(p).name)  # as stored (.csv or .csv.gz)
    rejects["reason"] = [
        f"{REJECTED.get(t, t.lower())} ({m})" for t, m in zip(rejects["error_type"], rejects["message"])
    ]
    unusable = {  # file -> SQL of (source_row, column, text)
        TRANSACTIONS: 'SELECT source_row, "column", text FROM tx_malformed'
        if counts["transactions_malformed_dropped"]
        else None,
        CUSTOMERS: "SELECT source_row, 'customer_id' AS \"column\", text FROM customers_in WHERE nullif(customer_id, '') IS NULL",
        ARTICLES: "SELECT source_row, 'article_id' AS \"column\", text FROM articles_in WHERE article_id IS NULL",
    }
    read = {
        TRANSACTIONS: counts["transactions"],
        CUSTOMERS: counts["customers_rows"],
        ARTICLES: counts["articles_rows"],
    }
    parts, lines_rejected = {"rejected": rejects[["file", "line", "column", "reason", "text"]]}, {}
    for name, sql in unusable.items():
        if name not in files:  # an optional file that is not there (hm_files.OPTIONAL_FILES)
            continue
        rejected = rejects[rejects["file"] == files[name].path.name]
        lines_rejected[name] = len(rejected)
        if read[name] == 0 and len(rejected):
            first = rejected.iloc[0]
            raise DataError(
                f"{files[name].unit} {first['line']}: {first['reason']}; no line of the file could be read",
                path=files[name].path,
                column=first["column"],
            )
        rows = db.arrow(sql + " ORDER BY source_row").to_pandas() if sql else None
        if rows is None or rows.empty:
            continue
        rows["line"] = _lines(rows.pop("source_row").to_numpy(), rejected["line"].to_numpy(), files[name].header_lines)
        rows["file"] = files[name].path.name
        rows["reason"] = rows["column"].map({**UNUSABLE, "t_dat": _date_reason(date_format)})
        parts[name] = rows
    if 0 < counts["transactions"] == counts["transactions_malformed_dropped"]:
        first = parts[TRANSACTIONS].iloc[0]
        raise DataError(
            f"{files[TRANSACTIONS].unit} {first['line']}: {first['reason']}; no transaction has a "
            "customer id, a date and an article id",
            path=files[TRANSACTIONS].path,
            column=first["column"],
        )
    return pd.concat(parts.values(), ignore_index=True), lines_rejected
