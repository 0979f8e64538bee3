"""Reading the raw tables for validation: `<table>.parquet`, or `<table>.csv` (separated by any of
contract.DELIMITERS) with list columns as JSON (`["a", "b"]`) or `a|b` text (in a CSV an empty cell is an empty
list; `null` is a missing one), each typed to the contract. Cells that do not parse are flagged, not dropped: the
checks (`validation.py`) quarantine their rows. Malformed input (missing file or column, wrong column type, not
Parquet/CSV, not UTF-8, empty table) raises a one-line `DataError` naming the file and column.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contextual_bert.data.contract import (
    DATE_TYPE,
    ID_COLUMN,
    OPTIONAL_COLUMNS,
    check_columns,
    column_names,
    parse_dates,
    read_header,
)
from contextual_bert.errors import DataError

MAY_BE_EMPTY = ("customers",)  # curated outfits may come without any customer
_TYPE_NAMES = {"string": "text", "float": "numbers", "list[string]": "lists of text", "date": "dates"}


# --- reading: one table in, typed to the contract ----------------------------------------------------


@dataclass
class LoadedTable:
    name: str
    path: Path
    raw: pa.Table  # as read: what quarantine keeps
    typed: pa.Table  # the contract's types (string, float64, list<string>); extra columns as read
    parse_ok: dict[str, np.ndarray] = field(default_factory=dict)  # column -> row parsed (text input only)

    @property
    def n_rows(self) -> int:
        return self.typed.num_rows


def find_table(raw_dir: Path, name: str) -> Path:
    """`<name>.parquet`, else `<name>.csv`; a clear error naming what was expected otherwise."""
    for suffix in (".parquet", ".csv"):
        if (path := Path(raw_dir) / f"{name}{suffix}").is_file():
            return path
    others = sorted(p.name for p in Path(raw_dir).glob(f"{name}.*")) if Path(raw_dir).is_dir() else []
    found = f" (found {', '.join(others)}: neither Parquet nor CSV)" if others else ""
    raise DataError(f"file not found: expected {name}.parquet or {name}.csv{found}", path=Path(raw_dir) / name)


def _read_parquet(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise DataError(f"not a readable Parquet file ({str(exc).splitlines()[0]})", path=path) from None


def _read_csv(path: Path, id_column: str) -> pa.Table:
    """A CSV as text columns, separated by any of contract.DELIMITERS (the first that splits the header
    row into names holding `id_column`)."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataError(f"not UTF-8 text (line {line}, byte {exc.start}: {exc.reason})", path=path) from None
    if not data.strip():
        raise DataError("table is empty (no header, no rows)", path=path)
    delim, _ = read_header(path, (id_column,))
    try:
        frame = pd.read_csv(path, sep=delim, dtype=str, keep_default_na=False, na_values=[""], encoding="utf-8-sig")
    except pd.errors.ParserError as exc:  # (an empty file was refused above: pandas' EmptyDataError cannot occur)
        raise DataError(f"not a valid CSV file ({str(exc).strip().splitlines()[-1]})", path=path) from None
    return pa.table({c: pa.array(frame[c].astype(object).where(frame[c].notna(), None), pa.string())
                     for c in frame.columns})  # fmt: skip


def _parse_float(text: pa.Array, path: Path, column: str) -> tuple[pa.Array, np.ndarray]:
    values = pd.to_numeric(pd.Series(text.to_pandas(), dtype=object), errors="coerce").astype("float64")
    present = ~pc.is_null(text).to_numpy(zero_copy_only=False)
    parsed = np.isfinite(values.to_numpy())
    ok = ~present | parsed
    if present.any() and not parsed[present].any():
        example = text.filter(pa.array(present))[0].as_py()
        raise DataError(f"expected numbers, found text such as {example!r}", path=path, column=column)
    return pa.array(values.where(parsed, None), pa.float64()), ok


def _parse_date(text: pa.Array, path: Path, column: str) -> tuple[pa.Array, np.ndarray]:
    """Text dates (contract.parse_dates); a column where no present value is a date is a DataError, as for
    numbers: the column is not what it says."""
    dates, present, ok = parse_dates(text.to_pandas())
    if present.any() and ok[present].sum() == 0:
        example = text.filter(pa.array(present))[0].as_py()
        raise DataError(f"expected dates, found text such as {example!r}", path=path, column=column)
    return dates, ok


def _parse_list_cell(cell: str | None, empty_is_list: bool) -> tuple[list[str] | None, bool]:
    if cell is None:  # a CSV cannot tell an empty list from a missing one: there it is an empty list
        return ([] if empty_is_list else None), True
    text = cell.strip()
    if text.startswith("[") or text == "null":
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None, False
        if value is None:
            return None, True
        return (value, True) if isinstance(value, list) and all(isinstance(v, str) for v in value) else (None, False)
    return ([part.strip() for part in text.split("|")] if text else []), True


def _parse_list(text: pa.Array, empty_is_list: bool) -> tuple[pa.Array, np.ndarray]:
    parsed = [_parse_list_cell(cell, empty_is_list) for cell in text.to_pylist()]
    return pa.array([p for p, _ in parsed], pa.list_(pa.string())), np.array([ok for _, ok in parsed], bool)


def _to_contract_type(array: pa.Array, logical: str, path: Path, column: str):
    """Cast one column to its contract type; text is parsed row by row, anything else is a DataError."""
    csv = path.suffix == ".csv"
    kind = array.type
    if pa.types.is_dictionary(kind):
        array, kind = array.cast(kind.value_type), kind.value_type
    is_text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    if pa.types.is_null(kind):
        target = {"string": pa.string(), "float": pa.float64(), "list[string]": pa.list_(pa.string()),
                  "date": DATE_TYPE}[logical]  # fmt: skip
        return array.cast(target), None
    if logical == "string" and is_text:
        return array.cast(pa.string()), None
    if logical == "float":
        if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
            return array.cast(pa.float64()), None
        if is_text:
            return _parse_float(array, path, column)
    if logical == "date":
        if pa.types.is_date32(kind):
            return array, None
        if pa.types.is_date(kind) or pa.types.is_timestamp(kind):  # a timestamp: its day
            return parse_dates(array.to_pandas())[0], None
        if is_text:
            return _parse_date(array, path, column)
    if logical == "list[string]":
        if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and (
            pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)
            or pa.types.is_null(kind.value_type)
        ):  # fmt: skip
            return array.cast(pa.list_(pa.string())), None
        if is_text:
            return _parse_list(array, empty_is_list=csv)
    raise DataError(f"expected {_TYPE_NAMES[logical]}, found {kind}", path=path, column=column)


def read_table(path: Path, name: str, columns: dict[str, str]) -> LoadedTable:
    """Read one raw table and type its contract columns (`columns`: name -> logical type)."""
    path = Path(path)
    raw = _read_parquet(path) if path.suffix == ".parquet" else _read_csv(path, ID_COLUMN[name])
    if raw.num_rows == 0 and name not in MAY_BE_EMPTY:
        raise DataError("table is empty (no rows)", path=path)
    if isinstance(raw.column(0), pa.ChunkedArray):
        raw = raw.combine_chunks()
    optional = {c: t for c, t in OPTIONAL_COLUMNS[name].items() if c not in columns}
    names = column_names(raw.column_names, (*columns, *optional))  # a contract column in any letter case is it
    check_columns(names, (), path)
    raw = raw.rename_columns(names)
    for column in columns:
        if column not in raw.column_names:
            close = difflib.get_close_matches(column, raw.column_names, n=1)
            hint = f" (found '{close[0]}': misspelled?)" if close else ""
            raise DataError(f"required column missing{hint}", path=path, column=column)
    typed, parse_ok = {}, {}
    columns = {**columns, **{c: t for c, t in optional.items() if c in raw.column_names}}  # those present
    for column in raw.column_names:
        array = raw.column(column).combine_chunks()
        if column in columns:
            array, ok = _to_contract_type(array, columns[column], path, column)
            if ok is not None:
                parse_ok[column] = ok
        typed[column] = array
    return LoadedTable(name, path, raw, pa.table(typed), parse_ok)
