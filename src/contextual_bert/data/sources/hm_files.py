"""The H&M files as the importer reads them: their names, the columns it knows and needs, where each table is
(`<name>`, `.csv.gz` or `.parquet`) and its header, and the DuckDB connection that reads them (`hm.py` maps them
to the raw contract)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from contextual_bert.config import ImportHMConfig
from contextual_bert.data.contract import check_columns, column_names, read_header
from contextual_bert.errors import DataError

TRANSACTIONS, CUSTOMERS, ARTICLES = "transactions_train.csv", "customers.csv", "articles.csv"
ARTICLE_COLUMNS = {  # contract column <- H&M column
    "product_type": "product_type_name",
    "brand": "section_name",
    "color": "colour_group_name",
    "style": "graphical_appearance_name",
}


EXTRA_ARTICLE_COLUMNS = (
    "prod_name",
    "product_group_name",
    "index_group_name",
    "garment_group_name",
    "detail_desc",
)  # detail_desc: a text attribute (features.article_attributes.hm)


CUSTOMER_COLUMNS = ("customer_id", "FN", "Active", "club_member_status", "fashion_news_frequency", "age",
                    "postal_code")  # fmt: skip


TRANSACTION_COLUMNS = ("t_dat", "customer_id", "article_id", "price")


# what makes a basket (price only prices the articles: without it every article's price is missing)
REQUIRED_COLUMNS = {TRANSACTIONS: TRANSACTION_COLUMNS[:3], CUSTOMERS: ("customer_id",), ARTICLES: ("article_id",)}


FILE_SUFFIXES = (".csv", ".csv.gz", ".parquet")  # how an H&M file may be stored: as Kaggle's, gzipped, or Parquet


KNOWN_COLUMNS = {TRANSACTIONS: TRANSACTION_COLUMNS, CUSTOMERS: CUSTOMER_COLUMNS,  # read whatever their letter case
                 ARTICLES: ("article_id", *ARTICLE_COLUMNS.values(), *EXTRA_ARTICLE_COLUMNS)}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class _SourceFile:
    """One H&M file: its path, its columns as the contract names them (contract.column_names), and its field
    delimiter (a CSV, gzipped or not) or the column names as written (a Parquet file)."""

    path: Path
    columns: tuple[str, ...]
    delim: str = ","
    written: tuple[str, ...] | None = None

    @property
    def header_lines(self) -> int:
        """Lines before the first row: a CSV's header row; a Parquet file's rows are its "lines"."""
        return 0 if self.written is not None else 1

    @property
    def unit(self) -> str:
        """What a quarantined `line` counts in this file, for messages."""
        return "row" if self.written is not None else "line"

    def read(self) -> str:
        """SQL: the file, its columns as text (empty -> NULL), read in parallel. A CSV is not sniffed: one
        line of the wrong width failed the sniffer for the whole file. A line DuckDB cannot read (too many or
        too few fields, a quote left open, bytes that are not UTF-8) is skipped and logged in `reject_errors`.
        A Parquet file's typed columns are cast to text (an integer article id, a timestamp t_dat, a double
        price) and parsed as a CSV's are: one path for every format."""
        if self.written is not None:
            select = ", ".join(
                f"CAST({_ident(written)} AS VARCHAR) AS {_ident(name)}"
                for written, name in zip(self.written, self.columns)
            )
            return f"(SELECT {select} FROM read_parquet({_quote(self.path)}))"
        columns = ", ".join(f"{_quote(name)}: 'VARCHAR'" for name in self.columns)
        return (
            f"read_csv({_quote(self.path)}, header=true, auto_detect=false, columns={{{columns}}}, "
            f"delim={_quote(self.delim)}, quote='\"', escape='\"', store_rejects=true)"
        )

    def row_text(self, alias: str) -> str:
        """SQL: a row as read, its fields joined by the delimiter (what the quarantine keeps of a row that was
        read; computed for such rows only)."""
        fields = ", ".join(f"coalesce({alias}.{_ident(c)}, '')" for c in self.columns)
        return f"concat_ws({_quote(self.delim)}, {fields})"

    def number(self, sql: str) -> str:
        """SQL: text as a number, NULL where it is none. In a file not separated by commas a decimal comma
        is read too (`0,0508`: the spreadsheets that write ';' write numbers so)."""
        text = f"trim({sql})" if self.delim == "," else f"replace(trim({sql}), ',', '.')"
        return f"TRY_CAST({text} AS DOUBLE)"

    def optional(self, column: str, sql: str | None = None) -> str:
        """SQL: an optional column of `src` (or `sql` of it), NULL for every row where the file lacks it."""
        return (sql or f"src.{_ident(column)}") if column in self.columns else "CAST(NULL AS VARCHAR)"


OPTIONAL_FILES = (CUSTOMERS,)  # without it the outfits have no context: the models that read none train


def _source_files(source: Path) -> dict[str, _SourceFile]:
    """The H&M files in the folder `source`, by their Kaggle names: transactions and articles, and customers
    where there is one (a missing folder or required file -> DataError)."""
    if not source.is_dir():
        raise DataError("H&M source folder not found", path=source)
    files = {name: _source_file(source, name) for name in (TRANSACTIONS, CUSTOMERS, ARTICLES)}
    return {name: file for name, file in files.items() if file is not None}


def _source_file(source: Path, name: str) -> _SourceFile | None:
    """The H&M file `name` (a Kaggle file name) in `source`, stored as FILE_SUFFIXES allow, as its header row
    or Parquet schema describes it (contract.read_header, column_names); None for an optional file that is not
    there. A required file missing, two of them, or a bad header -> DataError."""
    stem = name.removesuffix(".csv")
    found = [source / f"{stem}{suffix}" for suffix in FILE_SUFFIXES if (source / f"{stem}{suffix}").is_file()]
    if not found and name in OPTIONAL_FILES:
        return None
    if not found:
        stored = " or ".join(f"{stem}{suffix}" for suffix in FILE_SUFFIXES[1:])
        raise DataError(f"file not found (expected the H&M Kaggle file of that name, or {stored})", path=source / name)
    if len(found) > 1:
        raise DataError(f"{' and '.join(p.name for p in found)} both hold {stem}: keep one", path=source / name)
    path, required, known = found[0], REQUIRED_COLUMNS[name], KNOWN_COLUMNS[name]
    if path.suffix != ".parquet":
        delim, columns = read_header(path, required, known)
        return _SourceFile(path, tuple(columns), delim)
    try:
        written = pq.read_schema(path).names
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"not a Parquet file ({str(exc).splitlines()[0]})", path=path) from None
    columns = column_names(written, required, known)
    check_columns(columns, required, path)
    return _SourceFile(path, tuple(columns), written=tuple(written))


def _quote(text: Path | str) -> str:
    """A SQL string literal."""
    return "'" + str(text).replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class _Db:
    """A DuckDB connection on a scratch database file, with the configured memory limit and threads;
    a failing statement becomes a one-line DataError naming the file it was reading."""

    def __init__(self, scratch: Path, cfg: ImportHMConfig):
        import duckdb

        self.duckdb = duckdb
        self.con = duckdb.connect(str(scratch / "import.duckdb"))
        self.con.execute(f"SET memory_limit = '{cfg.memory_limit_gib * 1024:.0f}MiB'")
        self.con.execute(f"SET temp_directory = {_quote(scratch / 'spill')}")
        self.con.execute(f"SET threads = {cfg.threads or os.cpu_count() or 1}")
        # A Parquet t_dat with a time zone is an instant: its day (cast to text) is taken in UTC, not in the
        # machine's zone, so that every machine imports the same days.
        self.con.execute("SET TimeZone = 'UTC'")

    @contextlib.contextmanager
    def joins_as_written(self):
        """Joins in the order written, each building its hash table from its right side. A CSV read that is
        not sniffed has no row estimate (DuckDB guesses a few dozen), so the optimizer would build from the
        31.8 M transactions instead of the dictionaries: 54 s against 8 s at the full size."""
        self.con.execute("SET disabled_optimizers = 'join_order,build_side_probe_side'")
        try:
            yield
        finally:
            self.con.execute("RESET disabled_optimizers")

    def run(self, sql: str, path: Path | None = None):
        try:
            return self.con.execute(sql)
        except self.duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0]
            if "unicode" in first.lower() or "utf" in first.lower():
                raise DataError(f"not UTF-8 text ({first})", path=path) from None
            if path is None:
                raise
            kind = "Parquet" if path.suffix == ".parquet" else "CSV"
            raise DataError(f"not a valid {kind} file ({first})", path=path) from None

    def one(self, sql: str, path: Path | None = None) -> tuple:
        (row,) = self.run(sql, path).fetchall()  # fetched to the end: the connection is free again
        return row

    def arrow(self, sql: str):
        """A query's result as a pyarrow Table (through con.sql: execute()'s Arrow output copies the rows)."""
        return self.con.sql(sql).to_arrow_table()
