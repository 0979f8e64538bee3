"""Validate the raw tables with Great Expectations; valid rows go on, failing rows go to quarantine.

Order matters: articles first, then customers (their preferences may reference article values), then
outfits: an outfit that references a quarantined article or customer row is itself quarantined. An outfit
may reference an article or customer that has no row at all (its attributes or context are then missing)
and may have no customer (customer_id null: curated sets); an article's attributes may be missing (null).
The customers table may be empty. Rows in = valid + quarantined, for every table. The outfits' optional
`date` (contract.DATE_COLUMN): where the column is there, an outfit without a date, or whose date does not
parse, is quarantined with that reason; the valid outfits keep it as date32.

Some checks are about lists (an outfit's article ids, a customer's preferred brands) or about other tables.
Great Expectations sees those through computed helper columns named `<column>__<what>` (e.g.
`article_ids__n_items`), checked by ordinary GE expectations that report the failing rows; each failing row
is quarantined with the names of the expectations it failed (`failed_expectations`). Quarantined rows are
written as they were read (for a CSV: its text), so nothing is lost. A duplicated id quarantines every row
that carries it: which one is right cannot be told.

Reading the tables (Parquet or CSV, typed to the contract; malformed input is a one-line `DataError`) is
`raw_tables.py`'s.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contextual_bert.config import IngestConfig, ModelConfig, ValidateConfig
from contextual_bert.data.contract import DATE_COLUMN, ID_COLUMN, SCHEMA_FILE, TABLES, DataSchema
from contextual_bert.data.raw_tables import LoadedTable, find_table, read_table
from contextual_bert.errors import ContextualBertError

LARGEST = float(np.finfo(np.float64).max)  # a number's bound where none is declared: infinity fails it

FAILED_COLUMN = "failed_expectations"
ARTICLE_ATTRIBUTES = ("product_type", "brand", "color", "style")  # optional: missing (null) is allowed


# --- checks: helper columns + GE expectations ---------------------------------------------------------


@dataclass
class Checks:
    """What Great Expectations sees for one table: the frame (contract and helper columns) and the suite."""

    frame: pd.DataFrame
    expectations: list = field(default_factory=list)

    def add(self, expectation, notes: str) -> None:
        columns = [c for c in (getattr(expectation, k, None) for k in ("column", "column_A", "column_B")) if c]
        name = f"{expectation.expectation_type}({', '.join(columns)})"
        if any(e.meta["name"] == name for e in self.expectations):
            raise RuntimeError(f"two expectations named {name}: failing rows could not be told apart")
        expectation.meta = {"name": name, "notes": {"format": "markdown", "content": [notes]}}
        self.expectations.append(expectation)


def _list_stats(values: pa.Array, allowed: pa.Array | None = None) -> dict[str, np.ndarray]:
    """Per list row: n items, n distinct, n empty/null elements, n elements outside `allowed`."""
    n = len(values)
    null = pc.is_null(values).to_numpy(zero_copy_only=False)
    n_items = pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(values)
    parent = pc.list_parent_indices(values).to_numpy(zero_copy_only=False).astype(np.int64)
    bad_element = pc.fill_null(pc.equal(pc.utf8_length(flat), 0), True).to_numpy(zero_copy_only=False)
    codes = pc.dictionary_encode(flat).indices.to_numpy(zero_copy_only=False)
    codes = np.where(np.isnan(codes.astype(float)), -1, codes).astype(np.int64)  # null elements
    width = int(codes.max(initial=0)) + 2
    pairs = np.sort(parent * width + codes + 1)  # distinct (row, value) pairs; sorted by hand: numpy 2.4's
    pairs = pairs[np.append(True, pairs[1:] != pairs[:-1])] if len(pairs) else pairs  # np.unique took 19 s here
    stats = {
        "null": null,
        "n_items": n_items,
        "n_distinct": np.bincount(pairs // width, minlength=n),
        "n_bad": np.bincount(parent, bad_element.astype(np.int64), minlength=n).astype(np.int64),
    }
    if allowed is not None:
        outside = ~pc.fill_null(pc.is_in(flat, value_set=allowed), False).to_numpy(zero_copy_only=False)
        stats["n_outside"] = np.bincount(parent, outside.astype(np.int64), minlength=n).astype(np.int64)
    return stats


def _nullable(values: np.ndarray, null: np.ndarray) -> np.ndarray:
    return np.where(null, np.nan, values.astype(float))


def _scalar_frame(table: LoadedTable, list_columns: set[str]) -> pd.DataFrame:
    """The table as GE's frame. A list column stands there as its lists' lengths (NaN where a list is missing):
    GE checks it for nulls only (what is inside a list it sees through helper columns), and the lists as
    Python objects cost 1.8 GiB and 15 s for H&M's 2.7M outfits."""
    scalar = [c for c in table.typed.column_names if c not in list_columns]
    frame = table.typed.select(scalar).to_pandas()
    for column in list_columns:
        frame[column] = pc.list_value_length(table.typed.column(column)).to_numpy(zero_copy_only=False)
    return frame


def _id_checks(checks: Checks, column: str, unique: bool) -> None:
    import great_expectations.expectations as gxe

    checks.add(gxe.ExpectColumnValuesToNotBeNull(column=column), f"every row has a {column}")
    checks.add(gxe.ExpectColumnValueLengthsToBeBetween(column=column, min_value=1), f"{column} is not empty text")
    if unique:
        checks.add(gxe.ExpectColumnValuesToBeUnique(column=column), f"{column} identifies one row")


def _parse_checks(checks: Checks, table: LoadedTable) -> None:
    import great_expectations.expectations as gxe

    for column, ok in table.parse_ok.items():
        helper = f"{column}__parsed"
        checks.frame[helper] = ok
        checks.add(gxe.ExpectColumnValuesToBeInSet(column=helper, value_set=[True]), f"{column}'s text parses")


def article_checks(table: LoadedTable) -> Checks:
    import great_expectations.expectations as gxe

    # an extra list column (a products table's categories, an article vector) stands as its lengths: GE reads no
    # article column but the contract's, and a vector column of Python objects would cost what the lists cost
    lists = {field.name for field in table.typed.schema if pa.types.is_list(field.type)
             or pa.types.is_large_list(field.type) or pa.types.is_fixed_size_list(field.type)}  # fmt: skip
    checks = Checks(_scalar_frame(table, lists))
    _id_checks(checks, "article_id", unique=True)
    for column in ARTICLE_ATTRIBUTES:  # a missing attribute is null; an empty text is a fault
        checks.add(gxe.ExpectColumnValueLengthsToBeBetween(column=column, min_value=1), f"{column} is not empty")
    checks.add(gxe.ExpectColumnValuesToBeBetween(column="price", min_value=0, max_value=LARGEST, strict_min=True),
               "price > 0 and finite where known")  # fmt: skip
    _parse_checks(checks, table)
    return checks


def context_checks(checks: Checks, table: LoadedTable, schema: DataSchema, valid_articles: pa.Table) -> None:
    """The declared context columns of a table: nulls, allowed values, ranges, references to articles."""
    import great_expectations.expectations as gxe

    for col in (c for c in schema.context_columns if c.table == table.name):
        name = col.name
        if col.kind == "multi_categorical":
            allowed = None
            if col.values is not None and col.references is not None:
                raise ContextualBertError(f"{SCHEMA_FILE}: '{name}' declares both values and references")
            if col.values is not None:
                allowed = pa.array(list(col.values), pa.string())
            elif col.references is not None:
                ref_table, ref_column = col.references.split(".", 1)
                if ref_table != "articles" or ref_column not in valid_articles.column_names:
                    raise ContextualBertError(f"{SCHEMA_FILE}: '{name}' references unknown column {col.references}")
                allowed = pc.unique(valid_articles.column(ref_column).combine_chunks())
            stats = _list_stats(table.typed.column(name).combine_chunks(), allowed)
            checks.frame[f"{name}__n_bad_values"] = _nullable(stats["n_bad"], stats["null"])
            checks.add(
                gxe.ExpectColumnValuesToBeInSet(column=f"{name}__n_bad_values", value_set=[0]),
                f"no empty or missing values inside {name}",
            )
            checks.frame[f"{name}__n_repeated"] = _nullable(stats["n_items"] - stats["n_distinct"], stats["null"])
            checks.add(
                gxe.ExpectColumnValuesToBeInSet(column=f"{name}__n_repeated", value_set=[0]),
                f"no value twice in {name}",
            )
            if allowed is not None:
                helper = f"{name}__n_unknown_values"
                checks.frame[helper] = _nullable(stats["n_outside"], stats["null"])
                what = f"one of {list(col.values)}" if col.values else f"a value of valid {col.references}"
                checks.add(gxe.ExpectColumnValuesToBeInSet(column=helper, value_set=[0]), f"every {name} is {what}")
        elif col.kind == "categorical":
            checks.add(gxe.ExpectColumnValueLengthsToBeBetween(column=name, min_value=1), f"{name} is not empty")
            if col.values is not None:
                checks.add(gxe.ExpectColumnValuesToBeInSet(column=name, value_set=list(col.values)),
                           f"{name} is one of the declared values")  # fmt: skip
        else:  # a number: finite (an infinite age or price is no measurement), within the declared range
            low = -LARGEST if col.min_value is None else col.min_value
            high = LARGEST if col.max_value is None else col.max_value
            declared = col.min_value is not None or col.max_value is not None
            checks.add(
                gxe.ExpectColumnValuesToBeBetween(column=name, min_value=low, max_value=high),
                f"{name} within [{col.min_value}, {col.max_value}]" if declared else f"{name} is finite",
            )
        if not col.nullable:
            checks.add(gxe.ExpectColumnValuesToNotBeNull(column=name), f"every row has a {name}")


def customer_checks(table: LoadedTable, schema: DataSchema, valid_articles: pa.Table) -> Checks:
    import great_expectations.expectations as gxe

    multi = {c.name for c in schema.context_columns if c.table == "customers" and c.kind == "multi_categorical"}
    checks = Checks(_scalar_frame(table, multi))
    _id_checks(checks, "customer_id", unique=True)
    context_checks(checks, table, schema, valid_articles)
    if {"price_min", "price_max"} <= set(checks.frame.columns):
        checks.add(
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A="price_max", column_B="price_min", or_equal=True, ignore_row_if="either_value_is_missing"
            ),
            "price_min <= price_max",
        )
    _parse_checks(checks, table)
    return checks


def outfit_checks(
    table: LoadedTable,
    schema: DataSchema,
    valid_articles: pa.Table,
    quarantined_articles: pa.Array,
    quarantined_customers: pa.Array,
    max_set_size: int = ModelConfig().max_set_size,
    min_set_size: int = IngestConfig().min_set_size,
) -> Checks:
    import great_expectations.expectations as gxe

    multi = {c.name for c in schema.context_columns if c.table == "outfits" and c.kind == "multi_categorical"}
    checks = Checks(_scalar_frame(table, {"article_ids"} | multi))
    frame = checks.frame
    _id_checks(checks, "outfit_id", unique=True)
    # No customer (null) or a customer without a row: kept, its context is missing. A quarantined one: not.
    checks.add(gxe.ExpectColumnValueLengthsToBeBetween(column="customer_id", min_value=1), "customer_id is not empty")
    quarantined = pc.fill_null(pc.is_in(table.typed.column("customer_id"), value_set=quarantined_customers), False)
    frame["customer_id__is_quarantined"] = quarantined.to_numpy(zero_copy_only=False)
    checks.add(
        gxe.ExpectColumnValuesToBeInSet(column="customer_id__is_quarantined", value_set=[False]),
        "the customer, where it has a row, passed validation (else: references a quarantined customer)",
    )
    checks.add(gxe.ExpectColumnValuesToNotBeNull(column="article_ids"), "every outfit has article ids")
    stats = _list_stats(table.typed.column("article_ids").combine_chunks(), quarantined_articles)
    frame["article_ids__n_items"] = _nullable(stats["n_items"], stats["null"])
    checks.add(
        gxe.ExpectColumnValuesToBeBetween(
            column="article_ids__n_items", min_value=min_set_size, max_value=max_set_size
        ),
        f"an outfit has {min_set_size}-{max_set_size} articles (model.max_set_size)",  # as before: the same reports
    )
    frame["article_ids__n_distinct"] = _nullable(stats["n_distinct"], stats["null"])
    checks.add(
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="article_ids__n_items", column_B="article_ids__n_distinct", ignore_row_if="either_value_is_missing"
        ),
        "no article twice in an outfit",
    )
    frame["article_ids__n_quarantined_articles"] = _nullable(stats["n_items"] - stats["n_outside"], stats["null"])
    checks.add(
        gxe.ExpectColumnValuesToBeInSet(column="article_ids__n_quarantined_articles", value_set=[0]),
        "every article with a row passed validation (else: references a quarantined article)",
    )
    if DATE_COLUMN in table.typed.column_names:  # optional; where there, every outfit has its day
        checks.add(gxe.ExpectColumnValuesToNotBeNull(column=DATE_COLUMN),
                   f"every outfit has a {DATE_COLUMN} (the column is there)")  # fmt: skip
    context_checks(checks, table, schema, valid_articles)
    _parse_checks(checks, table)
    return checks


# --- running: GE context, suites, checkpoints, Data Docs ---------------------------------------------


class _GreatExpectations:
    """One ephemeral GE context for a validation run, with a Data Docs site under `docs_dir`."""

    def __init__(self, docs_dir: Path):
        import great_expectations as gx
        from great_expectations.data_context.types.base import (
            DataContextConfig,
            InMemoryStoreBackendDefaults,
            ProgressBarsConfig,
        )

        self.gx = gx
        site = {
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir.resolve())},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder", "show_how_to_buttons": False},
        }
        config = DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
            data_docs_sites={"validation": site},
            progress_bars=ProgressBarsConfig(globally=False),
            analytics_enabled=False,
        )
        self.context = gx.get_context(mode="ephemeral", project_config=config)
        self.datasource = self.context.data_sources.add_pandas("raw")

    def failing_rows(self, name: str, checks: Checks) -> dict[str, np.ndarray]:
        """Run the table's suite as a checkpoint (updating Data Docs); expectation name -> failing rows."""
        gx = self.gx
        batch = self.datasource.add_dataframe_asset(name).add_batch_definition_whole_dataframe("all rows")
        suite = self.context.suites.add(gx.ExpectationSuite(name=name, expectations=checks.expectations))
        definition = self.context.validation_definitions.add(
            gx.ValidationDefinition(data=batch, suite=suite, name=name)
        )
        checkpoint = self.context.checkpoints.add(
            gx.Checkpoint(
                name=f"validate_{name}",
                validation_definitions=[definition],
                actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=["validation"])],
                result_format={"result_format": "COMPLETE"},
            )
        )
        result = checkpoint.run(batch_parameters={"dataframe": checks.frame})
        failing = {}
        for run in result.run_results.values():
            for res in run.results:
                assert res.expectation_config is not None, "each result is of an expectation"
                name_ = res.expectation_config.meta["name"]
                if res.exception_info.get("raised_exception"):
                    raise RuntimeError(f"{name}: {name_} raised {res.exception_info.get('exception_message')}")
                rows = res.result.get("unexpected_index_list") or []
                failing[name_] = np.asarray(rows, dtype=np.int64)
        return failing


def _split(table: LoadedTable, failing: dict[str, np.ndarray]) -> tuple[np.ndarray, pa.Array]:
    """Quarantine mask and, per quarantined row, the names of the expectations it failed."""
    names = sorted(failing)
    rows = np.concatenate([failing[n] for n in names] + [np.zeros(0, np.int64)])
    which = np.concatenate([np.full(len(failing[n]), i) for i, n in enumerate(names)] + [np.zeros(0, np.int64)])
    pairs = np.unique(np.stack([rows, which], axis=1), axis=0) if len(rows) else np.zeros((0, 2), np.int64)
    quarantined = np.zeros(table.n_rows, dtype=bool)
    quarantined[pairs[:, 0]] = True
    bad_rows = np.flatnonzero(quarantined)
    offsets = np.searchsorted(pairs[:, 0], np.append(bad_rows, table.n_rows)).astype(np.int32)
    values = pa.array(np.asarray(names, dtype=object)[pairs[:, 1]] if len(pairs) else [], pa.string())
    return quarantined, pa.ListArray.from_arrays(pa.array(offsets), values)


def _write(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _checks_for(
    name: str,
    table: LoadedTable,
    schema: DataSchema,
    valid: dict[str, pa.Table],
    quarantined_ids: dict[str, pa.Array],
    max_set_size: int,
    min_set_size: int,
) -> Checks:
    if name == "articles":
        return article_checks(table)
    if name == "customers":
        return customer_checks(table, schema, valid["articles"])
    return outfit_checks(table, schema, valid["articles"], quarantined_ids["articles"],
                         quarantined_ids["customers"], max_set_size, min_set_size)  # fmt: skip


def validate(
    raw_dir: Path,
    validated_dir: Path,
    quarantine_dir: Path,
    report_dir: Path,
    cfg: ValidateConfig,
    max_set_size: int = ModelConfig().max_set_size,
    min_set_size: int = IngestConfig().min_set_size,
) -> dict:
    """Validate data/raw; write data/validated, data/quarantine, reports/validation/{summary.json,data_docs}.

    Fails (ContextualBertError) when any table's quarantined share exceeds cfg.max_quarantine_share; the
    quarantine, summary and Data Docs are written first, so the failure can be inspected."""
    raw_dir, validated_dir, quarantine_dir, report_dir = map(Path, (raw_dir, validated_dir, quarantine_dir, report_dir))
    schema = DataSchema.load(raw_dir)
    tables = {name: read_table(find_table(raw_dir, name), name, schema.columns_of(name)) for name in TABLES}

    docs_dir = report_dir / "data_docs"
    shutil.rmtree(docs_dir, ignore_errors=True)
    ge = _GreatExpectations(docs_dir)
    summary: dict = {"source": schema.source, "max_quarantine_share": cfg.max_quarantine_share, "tables": {}}
    valid: dict[str, pa.Table] = {}
    quarantined_ids: dict[str, pa.Array] = {}  # what an outfit must not reference
    over: dict[str, float] = {}
    for name, table in tables.items():  # in TABLES order: what an outfit references is validated first
        checks = _checks_for(name, table, schema, valid, quarantined_ids, max_set_size, min_set_size)
        failing = ge.failing_rows(name, checks)
        quarantined, reasons = _split(table, failing)
        valid[name] = table.typed.filter(pa.array(~quarantined))
        ids = table.typed.column(ID_COLUMN[name]).combine_chunks().filter(pa.array(quarantined))
        quarantined_ids[name] = pc.unique(ids.drop_null())
        quarantine = table.raw.filter(pa.array(quarantined)).append_column(FAILED_COLUMN, reasons)
        _write(quarantine, quarantine_dir / f"{name}.parquet")
        if valid[name].num_rows + quarantine.num_rows != table.n_rows:
            raise RuntimeError(f"{name}: rows lost between validated and quarantine")  # cannot happen
        share = quarantine.num_rows / table.n_rows if table.n_rows else 0.0
        if share > cfg.max_quarantine_share:
            over[name] = share
        summary["tables"][name] = {
            "file": str(table.path),
            "rows_in": table.n_rows,
            "valid": valid[name].num_rows,
            "quarantined": quarantine.num_rows,
            "quarantined_share": round(share, 6),
            "id_column": ID_COLUMN[name],
            "failed_rows_by_expectation": {k: int(len(np.unique(v))) for k, v in sorted(failing.items()) if len(v)},
            "expectations": len(checks.expectations),
        }

    summary["passed"] = not over
    summary["data_docs"] = str(docs_dir / "index.html")
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    for name in TABLES:  # never leave validated tables behind that this run did not pass
        (validated_dir / f"{name}.parquet").unlink(missing_ok=True)
    if over:
        worst = max(over, key=over.__getitem__)
        raise ContextualBertError(
            f"{over[worst]:.1%} of {worst} quarantined, above validate.max_quarantine_share "
            f"{cfg.max_quarantine_share:.1%}; see {quarantine_dir / (worst + '.parquet')} "
            f"and {report_dir / 'summary.json'}"
        )
    for name in TABLES:
        _write(valid[name], validated_dir / f"{name}.parquet")
    shutil.copyfile(raw_dir / SCHEMA_FILE, validated_dir / SCHEMA_FILE)
    return summary
