"""The raw data contract: three Parquet tables under data/raw/ and a schema file beside them.

articles:  article_id (string), product_type, brand, color, style (strings), price (float > 0), more allowed.
           The attributes are optional: null where unknown (an articles file without them, curated items).
customers: customer_id (string) + the customer's context columns. May have no rows (curated sets).
outfits:   outfit_id (string), customer_id (string, null when the outfit has no customer), article_ids (list
           of 4-8 distinct article_id strings) + per-outfit context columns (e.g. occasion).
           Optional: `date` (DATE_COLUMN; logical type date, Arrow date32 in Parquet, ISO text in a CSV), the day
           the outfit was worn or bought. It orders a customer's outfits in time (history.py: an outfit's
           history is its customer's strictly earlier outfits). Where the column is present every outfit needs
           a date (a null or unparseable one quarantines the outfit); without it nothing reads a time.
           An outfit may name a customer or articles that have no row: their context or attributes are then
           missing, the outfit is kept (only the article ids are needed to train).

Context columns are declared in `schema.json`, not hard-coded, so the synthetic data (the paper's features)
and imported data (H&M's) flow through the same validation and feature code.

An importer also writes `import_quarantine.parquet` beside the tables: every source line it could not use
(file, line, column, reason, text), so that nothing is dropped unseen; ingest_report.json counts them.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import zlib
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from contextual_bert.errors import DataError

DELIMITED_SUFFIXES = (".csv", ".tsv")  # text read by read_delimited, whatever its delimiter
TABLE_SUFFIXES = (*DELIMITED_SUFFIXES, ".parquet", ".jsonl")  # what read_rows reads
UNREAD_COLUMNS = ["line", "column", "reason", "text"]  # a file's lines that could not be read
SOURCE_LINE = "__line__"  # read_rows: a row's place in its file (a name no data column has)

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
# Columns a table may have or not; where present, of this logical type ("date": a day, Arrow date32).
DATE_COLUMN = "date"
DATE_TYPE = pa.date32()
OPTIONAL_COLUMNS: dict[str, dict[str, str]] = {"articles": {}, "customers": {}, "outfits": {DATE_COLUMN: "date"}}
# Outfit sizes are settings, not part of the contract: the smallest is `ingest.min_set_size`, the largest
# `model.max_set_size` (params.yaml), each read by the generators, the importers and validation.

IMPORT_QUARANTINE = "import_quarantine.parquet"
# line: where in the source, from 1: a text file's line (a CSV's line 1 is its header; counted one row per line,
# so blank lines, which the readers skip, are not counted), a Parquet file's row, a Polyvore file's set; text:
# the line as written, or the row's values joined by commas
IMPORT_QUARANTINE_SCHEMA = pa.schema([("file", pa.string()), ("line", pa.int64()), ("column", pa.string()),
                                      ("reason", pa.string()), ("text", pa.string())])  # fmt: skip


# Field delimiters an importer accepts in a delimited text file, tried in this order on its header row: Kaggle's
# and most exports use commas; spreadsheets in locales with a decimal comma write ';'; tab- and '|'-separated
# exports are common too.
DELIMITERS = (",", ";", "\t", "|")
# Why a line of a delimited text file cannot be read (the importers' quarantine reasons).
UNREADABLE = {"encoding": "not UTF-8 text", "too_many": "too many fields", "too_few": "too few fields",
              "quote": "a quote left open or misplaced"}  # fmt: skip


def column_names(names: list[str], required: tuple[str, ...], known: tuple[str, ...] = ()) -> list[str]:
    """A file's column names as the contract reads them: stripped, a required or known column spelled as the
    contract does whatever its letter case (`T_DAT`, `Customer_Id`: other exports' spelling), an unnamed column
    (a pandas index) named column<i>, as DuckDB names it."""
    spelling = {name.casefold(): name for name in (*known, *required)}
    return [spelling.get(c.strip().casefold(), c.strip()) or f"column{i}" for i, c in enumerate(names)]


def check_columns(columns: list[str], required: tuple[str, ...], path: Path) -> None:
    """A required column missing or a column named twice -> DataError."""
    for column in required:
        if column not in columns:
            raise DataError("required column missing", path=path, column=column)
    for column in columns:
        if columns.count(column) > 1:
            raise DataError("column named twice", path=path, column=column)


GZIP_SUFFIX = ".gz"  # a text file may be stored gzip-compressed: its name then ends in .gz
GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)  # not gzip, cut short, corrupt


def text_suffix(path: Path) -> str:
    """The format a file's name says, whether gzipped or not: '.csv' for data.csv and for data.csv.gz."""
    path = Path(path)
    return Path(path.stem).suffix if path.suffix == GZIP_SUFFIX else path.suffix


@contextmanager
def open_binary(path: Path):
    """A file's bytes, gunzipped when its name ends in GZIP_SUFFIX. A stream that is not gzip, cut short or
    corrupt fails wherever the body reads it, as one DataError: never a silently shorter file."""
    try:
        with (gzip.open if Path(path).suffix == GZIP_SUFFIX else open)(path, "rb") as f:
            yield f
    except GZIP_ERRORS as exc:
        raise DataError(f"not a readable gzip file ({exc})", path=path) from None


def read_header(path: Path, required: tuple[str, ...], known: tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """(delimiter, column names) of a delimited text file's header row, gzip-compressed if its name ends in .gz:
    the first of DELIMITERS that splits it into names (column_names) holding every required column. Not UTF-8,
    no header row, a required column missing or a column named twice -> DataError. Only the first line is read:
    a bad line further down is that line's problem, not the file's."""
    try:
        with open_binary(path) as f:
            line = f.readline().decode("utf-8-sig")  # -sig: a spreadsheet's byte-order mark
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from None
    if not line.strip():
        raise DataError("not a delimited text file (no header row)", path=path)
    splits = {d: column_names(next(csv.reader([line], delimiter=d)), required, known) for d in DELIMITERS}
    delim = next((d for d in DELIMITERS if all(c in splits[d] for c in required)), None)
    if delim is None:
        missing = next(c for c in required if c not in splits[","])
        split_at = " or ".join(map(repr, DELIMITERS))
        raise DataError(
            f"required column missing (not in the header row split at {split_at})", path=path, column=missing
        )
    check_columns(splits[delim], required, path)
    return delim, splits[delim]


def read_delimited(
    path: Path, required: tuple[str, ...] = (), known: tuple[str, ...] = ()
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A delimited text file (contract.read_header: its delimiter and columns) as text columns (empty -> None)
    with SOURCE_LINE, its line in the file; and the lines that cannot be read (line, column, reason, text): bytes
    that are not UTF-8, a quote left open, too many or too few fields. Such a line is set aside, not the
    file. One row per line (a quoted field may not span lines); blank lines are skipped."""
    delim, columns = read_header(path, required, known)
    rows, lines, rejected = [], [], []
    # Bytes that are not UTF-8 come through as surrogates, found per line by a failing encode. A line without
    # a quote is split as it is (a csv reader per line costs 13x; one reader for the file would let a quote
    # left open swallow every line after it).
    with open_binary(path) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape",
                                                    newline="") as f:  # fmt: skip
        f.readline()
        for number, line in enumerate(f, start=2):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue  # a blank line
            reason = None
            if not line.isascii():
                try:
                    line.encode("utf-8")
                except UnicodeEncodeError:
                    column, reason = columns[0], UNREADABLE["encoding"]
                    line = line.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
            if reason is None and '"' in line:
                try:
                    fields = next(csv.reader([line], delimiter=delim, strict=True))
                except csv.Error:
                    column, reason = columns[0], UNREADABLE["quote"]
            elif reason is None:
                fields = line.split(delim)
            if reason is None and len(fields) != len(columns):
                wide = len(fields) > len(columns)
                column = columns[-1] if wide else columns[len(fields)]  # the first field missing
                reason = UNREADABLE["too_many" if wide else "too_few"] + f" ({len(fields)}, not {len(columns)})"
            if reason:
                rejected.append((number, column, reason, line))
                continue
            rows.append([v if v.strip() else None for v in fields])
            lines.append(number)
    frame = pd.DataFrame(rows, columns=columns, dtype=object) if rows else pd.DataFrame(columns=columns, dtype=object)
    frame[SOURCE_LINE] = np.asarray(lines, dtype=np.int64)
    return frame, pd.DataFrame(rejected, columns=UNREAD_COLUMNS)


def read_rows(
    path: Path, required: tuple[str, ...] = (), known: tuple[str, ...] = (), also: tuple[str, ...] = ()
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A .csv or .tsv (all text; delimited by any of contract.DELIMITERS), .parquet or .jsonl file (the text ones
    gzipped or not: contract.text_suffix) as a DataFrame with SOURCE_LINE (a text file's line, a Parquet or
    JSON-lines file's row, from 1), and the text lines that cannot be read (read_delimited). A missing or
    unreadable file, or another suffix, is a one-line DataError (naming TABLE_SUFFIXES and the caller's `also`)."""
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found", path=path)
    if text_suffix(path) in DELIMITED_SUFFIXES:
        return read_delimited(path, required, known)
    try:
        if path.suffix == ".parquet":  # compressed inside: never gzipped as a whole
            frame = pq.read_table(path).to_pandas()
        elif text_suffix(path) == ".jsonl":
            with open_binary(path) as f:
                frame = pd.read_json(f, lines=True, dtype=False)
        else:
            raise DataError(f"unknown suffix: expected one of {', '.join((*TABLE_SUFFIXES, *also))} (a text "
                            "one may be gzipped: .csv.gz)", path=path)  # fmt: skip
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from None
    except (ValueError, pa.ArrowException, OSError) as exc:
        raise DataError(f"not a readable {path.suffix[1:]} file ({str(exc).strip().splitlines()[0]})",
                        path=path) from None  # fmt: skip
    frame.columns = column_names([str(c) for c in frame.columns], required, known)  # as a CSV's header is read
    check_columns(list(frame.columns), (), path)
    frame[SOURCE_LINE] = np.arange(len(frame), dtype=np.int64) + 1
    return frame, pd.DataFrame(columns=UNREAD_COLUMNS)


def read_table_file(path: Path, required: tuple[str, ...] = ()) -> pd.DataFrame:
    """read_rows, where a CSV line that cannot be read is a one-line DataError (e.g. serving's catalogue)."""
    frame, unread = read_rows(path, required)
    if len(unread):
        first = unread.iloc[0]
        raise DataError(f"line {first['line']}: {first['reason']}", path=path, column=first["column"])
    return frame.drop(columns=SOURCE_LINE)


def parse_dates(values) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Dates as the contract stores them: (date32 array, present, parsed) per value. Text is read as an ISO date
    (2020-09-21, or an ISO date and time: its day); datetime-like values keep their day. A missing value is
    null (present False); a present one that is no date is null too, with parsed False, so the caller can
    quarantine it with its reason."""
    series = pd.Series(values, dtype=object).reset_index(drop=True)
    present = series.notna().to_numpy() & (series.astype(str).str.strip() != "").to_numpy()
    text = series.where(present, None)
    try:
        parsed_values = pd.to_datetime(text, errors="coerce", format="ISO8601")
    except (ValueError, TypeError, OverflowError):  # a mix pandas cannot take at once: value by value
        parsed_values = pd.Series([pd.to_datetime(v, errors="coerce", format="ISO8601") for v in text])
    if getattr(parsed_values.dt, "tz", None) is not None:
        parsed_values = parsed_values.dt.tz_localize(None)
    ok = parsed_values.notna().to_numpy()
    days = parsed_values.dt.normalize().to_numpy("datetime64[D]")
    return pa.array(days, DATE_TYPE, mask=~ok), present, ok | ~present


def write_import_quarantine(rows: pd.DataFrame, out_dir: Path) -> int:
    """Write an importer's unusable source lines (IMPORT_QUARANTINE_SCHEMA's columns), sorted by file and line;
    returns how many."""
    rows = rows.sort_values(["file", "line"], kind="stable")[IMPORT_QUARANTINE_SCHEMA.names]
    table = pa.Table.from_pandas(rows, schema=IMPORT_QUARANTINE_SCHEMA, preserve_index=False)
    pq.write_table(table, Path(out_dir) / IMPORT_QUARANTINE)
    return table.num_rows


ContextKind = Literal["categorical", "multi_categorical", "numeric"]
KIND_TO_TYPE = {"categorical": "string", "multi_categorical": "list[string]", "numeric": "float"}


@dataclass(frozen=True)
class ContextColumn:
    """One declared context column. The optional fields are checks that validation enforces."""

    name: str
    table: Literal["customers", "outfits"]
    kind: ContextKind
    nullable: bool = True  # may a value be missing (for multi_categorical: null; an empty list is fine)
    values: tuple[str, ...] | None = None  # allowed values (of every element, for multi_categorical)
    references: str | None = None  # "articles.<column>": every value must occur in that column
    min_value: float | None = None  # numeric range, inclusive
    max_value: float | None = None

    def __post_init__(self):
        if self.values is not None and not isinstance(self.values, tuple):
            object.__setattr__(self, "values", tuple(self.values))  # JSON gives lists; keep it hashable


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
        payload = {
            "source": self.source,
            "context_columns": [
                {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(c).items()}
                for c in self.context_columns
            ],
        }
        path.write_text(json.dumps(payload, indent=2))
        return path

    @classmethod
    def load(cls, directory: Path) -> DataSchema:
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


# Vocabularies of the paper's categorical context, as the synthetic generator writes them.
GENDERS = ("female", "male", "diverse")
COUNTRIES = ("DE", "FR", "IT", "ES", "NL", "PL", "SE", "AT", "CH", "BE")
TOP_SIZES = ("XS", "S", "M", "L", "XL", "XXL")
BOTTOM_SIZES = ("W26", "W28", "W30", "W32", "W34", "W36", "W38", "W40")
SHOE_SIZES = tuple(str(s) for s in range(35, 48))
OCCASIONS = ("casual", "office", "party", "sport", "vacation", "formal", "outdoor")

# The paper's customer context (Denk & Peleteiro Ramallo, 2020, sec. 4): what the generator writes.
# Synthetic data is complete, so a missing value there is a fault (nullable=False).
PAPER_SCHEMA = DataSchema(
    source="synthetic",
    context_columns=(
        ContextColumn("age", "customers", "numeric", nullable=False, min_value=16, max_value=100),
        ContextColumn("gender", "customers", "categorical", nullable=False, values=GENDERS),
        ContextColumn("country", "customers", "categorical", nullable=False, values=COUNTRIES),
        ContextColumn("preferred_brands", "customers", "multi_categorical", False, references="articles.brand"),
        ContextColumn("preferred_colors", "customers", "multi_categorical", False, references="articles.color"),
        ContextColumn("preferred_styles", "customers", "multi_categorical", False, references="articles.style"),
        ContextColumn(
            "nogo_product_types", "customers", "multi_categorical", False, references="articles.product_type"
        ),
        ContextColumn("size_top", "customers", "categorical", nullable=False, values=TOP_SIZES),
        ContextColumn("size_bottom", "customers", "categorical", nullable=False, values=BOTTOM_SIZES),
        ContextColumn("size_shoes", "customers", "categorical", nullable=False, values=SHOE_SIZES),
        ContextColumn("price_min", "customers", "numeric", nullable=False, min_value=0),
        ContextColumn("price_max", "customers", "numeric", nullable=False, min_value=0),
        ContextColumn("occasion", "outfits", "categorical", nullable=False, values=OCCASIONS),
    ),
)

# H&M Kaggle customers.csv columns kept as context. Real data has gaps: every column may be missing. No value set
# is declared: Kaggle's file has ACTIVE / PRE-CREATE / LEFT CLUB and NONE / None / Regularly / Monthly, but another
# export's new status is a category (a rare one enters as unknown), not a fault that would quarantine the customer
# and every outfit naming them.
HM_SCHEMA = DataSchema(
    source="hm",
    context_columns=(
        ContextColumn("age", "customers", "numeric", min_value=0, max_value=120),
        ContextColumn("club_member_status", "customers", "categorical"),
        ContextColumn("fashion_news_frequency", "customers", "categorical"),
        ContextColumn("FN", "customers", "categorical"),
        ContextColumn("Active", "customers", "categorical"),
        ContextColumn("postal_code", "customers", "categorical"),
    ),
)
