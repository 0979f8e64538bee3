"""Validation: every kind of fault is caught and named, counts add up, nothing is lost; malformed input
gives a one-line error (library and CLI)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import hm_fixture

from contextual_bert.cli import main
from contextual_bert.config import GeneratorSize, ImportHMConfig, ValidateConfig
from contextual_bert.data.contract import DATE_COLUMN, DATE_TYPE, TABLES
from contextual_bert.data.sources.hm import import_hm
from contextual_bert.data.sources.synthetic import generate
from contextual_bert.data.validation import FAILED_COLUMN, validate
from contextual_bert.errors import ContextualBertError, DataError

SMALL = GeneratorSize(n_outfits=400, n_articles=200, n_customers=60)
TAG = "_tag"  # an extra column the tests add to every table: which fault a row carries ("clean" otherwise)
LENIENT = ValidateConfig(max_quarantine_share=1.0)


def _run(root: Path, cfg: ValidateConfig = LENIENT) -> dict:
    return validate(root / "raw", root / "validated", root / "quarantine", root / "reports", cfg)


def _read(root: Path, kind: str, table: str) -> pd.DataFrame:
    return pd.read_parquet(root / kind / f"{table}.parquet")


@pytest.fixture(scope="module")
def clean_raw(tmp_path_factory) -> Path:
    raw = tmp_path_factory.mktemp("clean") / "raw"
    generate(SMALL, seed=3, out_dir=raw)
    return raw


def _tables(raw: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_parquet(raw / f"{name}.parquet").assign(**{TAG: "clean"}) for name in TABLES}


def _write(root: Path, clean_raw: Path, tables: dict[str, pd.DataFrame]) -> None:
    (root / "raw").mkdir(parents=True)
    shutil.copy(clean_raw / "schema.json", root / "raw")
    for name, frame in tables.items():
        frame.to_parquet(root / "raw" / f"{name}.parquet", index=False)


# --- a clean run -------------------------------------------------------------------------------------


def test_generated_data_passes_whole(clean_raw, tmp_path):
    shutil.copytree(clean_raw, tmp_path / "raw")
    summary = _run(tmp_path, ValidateConfig())
    assert summary["passed"]
    for name in TABLES:
        assert summary["tables"][name]["quarantined"] == 0
        assert pq.read_table(tmp_path / "validated" / f"{name}.parquet").equals(
            pq.read_table(clean_raw / f"{name}.parquet")
        )
        assert len(_read(tmp_path, "quarantine", name)) == 0
    assert (tmp_path / "validated" / "schema.json").read_text() == (clean_raw / "schema.json").read_text()
    assert json.loads((tmp_path / "reports" / "summary.json").read_text()) == summary
    index = (tmp_path / "reports" / "data_docs" / "index.html").read_text()
    assert index.lstrip().lower().startswith("<!doctype html") and "</html>" in index
    for name in TABLES:  # a results page per table
        assert name in index
    assert list((tmp_path / "reports" / "data_docs" / "validations").rglob("*.html"))


# --- one fault of every kind, in one run ----------------------------------------------------------------

# tag -> (table, the expectation that must name it)
FAULTS = {
    "article_empty_brand": ("articles", "expect_column_value_lengths_to_be_between(brand)"),
    "article_negative_price": ("articles", "expect_column_values_to_be_between(price)"),
    "article_infinite_price": ("articles", "expect_column_values_to_be_between(price)"),
    "article_duplicate_id": ("articles", "expect_column_values_to_be_unique(article_id)"),
    "article_null_id": ("articles", "expect_column_values_to_not_be_null(article_id)"),
    "customer_duplicate_id": ("customers", "expect_column_values_to_be_unique(customer_id)"),
    "customer_unknown_gender": ("customers", "expect_column_values_to_be_in_set(gender)"),
    "customer_null_gender": ("customers", "expect_column_values_to_not_be_null(gender)"),
    "customer_age_out_of_range": ("customers", "expect_column_values_to_be_between(age)"),
    "customer_infinite_price_max": ("customers", "expect_column_values_to_be_between(price_max)"),
    "customer_unknown_brand": ("customers", "expect_column_values_to_be_in_set(preferred_brands__n_unknown_values)"),
    "customer_repeated_style": ("customers", "expect_column_values_to_be_in_set(preferred_styles__n_repeated)"),
    "customer_empty_nogo": ("customers", "expect_column_values_to_be_in_set(nogo_product_types__n_bad_values)"),
    "customer_price_range_reversed": (
        "customers",
        "expect_column_pair_values_a_to_be_greater_than_b(price_max, price_min)",
    ),  # fmt: skip
    "outfit_too_small": ("outfits", "expect_column_values_to_be_between(article_ids__n_items)"),
    "outfit_too_large": ("outfits", "expect_column_values_to_be_between(article_ids__n_items)"),
    "outfit_repeated_article": (
        "outfits",
        "expect_column_pair_values_to_be_equal(article_ids__n_items, article_ids__n_distinct)",
    ),  # fmt: skip
    "outfit_quarantined_article": (
        "outfits",
        "expect_column_values_to_be_in_set(article_ids__n_quarantined_articles)",
    ),  # fmt: skip
    "outfit_quarantined_customer": ("outfits", "expect_column_values_to_be_in_set(customer_id__is_quarantined)"),
    "outfit_empty_customer": ("outfits", "expect_column_value_lengths_to_be_between(customer_id)"),
    "outfit_unknown_occasion": ("outfits", "expect_column_values_to_be_in_set(occasion)"),
    "outfit_null_articles": ("outfits", "expect_column_values_to_not_be_null(article_ids)"),
    "outfit_duplicate_id": ("outfits", "expect_column_values_to_be_unique(outfit_id)"),
}
# Rows that look odd but are valid: a missing attribute, a reference to a row that does not exist (its
# attributes or context are then missing), an outfit without a customer. They must pass.
ACCEPTED = {
    "article_null_type": "articles",
    "article_null_price": "articles",
    "outfit_unknown_article": "outfits",
    "outfit_unknown_customer": "outfits",
    "outfit_no_customer": "outfits",
}


def _corrupt(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    a, c, o = (tables[n].copy() for n in TABLES)
    a[TAG], c[TAG], o[TAG] = "clean", "clean", "clean"

    def hit(frame, row, tag, **values):
        frame.loc[row, TAG] = tag
        for column, value in values.items():
            frame.at[row, column] = value

    hit(a, 0, "article_null_type", product_type=None)  # accepted
    hit(a, 1, "article_empty_brand", brand="")
    hit(a, 2, "article_negative_price", price=-5.0)
    hit(a, 3, "article_null_price", price=np.nan)
    hit(a, 4, "article_duplicate_id")
    hit(a, 5, "article_duplicate_id", article_id=a.at[4, "article_id"])
    hit(a, 6, "article_null_id", article_id=None)
    hit(a, 7, "article_infinite_price", price=np.inf)
    hit(c, 0, "customer_duplicate_id")
    hit(c, 1, "customer_duplicate_id", customer_id=c.at[0, "customer_id"])
    hit(c, 2, "customer_unknown_gender", gender="unknown")
    hit(c, 3, "customer_null_gender", gender=None)
    hit(c, 4, "customer_age_out_of_range", age=150.0)
    hit(c, 5, "customer_unknown_brand", preferred_brands=["no-such-brand"])
    hit(c, 6, "customer_repeated_style", preferred_styles=["casual", "casual"])
    hit(c, 7, "customer_empty_nogo", nogo_product_types=[""])
    hit(c, 8, "customer_price_range_reversed", price_min=500.0, price_max=10.0)
    hit(c, 9, "customer_infinite_price_max", price_max=np.inf)  # only a lower bound is declared

    bad_articles = set(a.loc[a[TAG] != "clean", "article_id"].dropna())
    bad_customers = set(c.loc[c[TAG] != "clean", "customer_id"])
    clean = o[~o["customer_id"].isin(bad_customers) & ~o["article_ids"].map(lambda ids: bool(set(ids) & bad_articles))]
    rows = list(clean.index)
    good_ids = [i for i in a["article_id"] if i not in bad_articles and i is not None][:9]
    hit(o, rows[0], "outfit_too_small", article_ids=good_ids[:3])
    hit(o, rows[1], "outfit_too_large", article_ids=good_ids[:9])
    hit(o, rows[2], "outfit_repeated_article", article_ids=[good_ids[0], good_ids[0], good_ids[1], good_ids[2]])
    hit(o, rows[3], "outfit_unknown_article", article_ids=good_ids[:3] + ["A9999999"])
    hit(o, rows[4], "outfit_quarantined_article", article_ids=good_ids[:3] + [a.at[2, "article_id"]])
    hit(o, rows[5], "outfit_unknown_customer", customer_id="C9999999")
    hit(o, rows[6], "outfit_quarantined_customer", customer_id=c.at[2, "customer_id"])
    hit(o, rows[7], "outfit_unknown_occasion", occasion="brunch")
    hit(o, rows[8], "outfit_null_articles", article_ids=None)
    hit(o, rows[9], "outfit_duplicate_id")
    hit(o, rows[10], "outfit_duplicate_id", outfit_id=o.at[rows[9], "outfit_id"])
    hit(o, rows[11], "outfit_no_customer", customer_id=None)
    hit(o, rows[12], "outfit_empty_customer", customer_id="")
    return {"articles": a, "customers": c, "outfits": o}


@pytest.fixture(scope="module")
def faulty(clean_raw, tmp_path_factory):
    root = tmp_path_factory.mktemp("faulty")
    raw_tables = _corrupt(_tables(clean_raw))
    _write(root, clean_raw, raw_tables)
    summary = _run(root)
    return root, raw_tables, summary


@pytest.mark.parametrize("tag", sorted(FAULTS))
def test_each_fault_is_quarantined_and_named(faulty, tag):
    root, _, _ = faulty
    table, expectation = FAULTS[tag]
    quarantined = _read(root, "quarantine", table)
    rows = quarantined[quarantined[TAG] == tag]
    assert len(rows) >= 1, f"{tag} not quarantined"
    for failed in rows[FAILED_COLUMN]:
        assert expectation in list(failed), (tag, list(failed))
    assert tag not in set(_read(root, "validated", table)[TAG])


def test_outfits_of_quarantined_rows_are_quarantined_too(faulty):
    root, raw, _ = faulty
    bad_articles = set(_read(root, "quarantine", "articles")["article_id"].dropna())
    bad_customers = set(_read(root, "quarantine", "customers")["customer_id"])
    outfits = raw["outfits"]
    cascading = outfits[
        (outfits[TAG] == "clean")
        & (
            outfits["customer_id"].isin(bad_customers)
            | outfits["article_ids"].map(lambda ids: ids is not None and bool(set(ids) & bad_articles))
        )
    ]
    assert len(cascading) > 0
    quarantined = _read(root, "quarantine", "outfits").set_index("outfit_id")
    for outfit_id in cascading["outfit_id"]:
        assert outfit_id in quarantined.index
    validated = _read(root, "validated", "outfits")
    assert not validated["customer_id"].isin(bad_customers).any()
    assert not validated["article_ids"].explode().isin(bad_articles).any()


@pytest.mark.parametrize("tag", sorted(ACCEPTED))
def test_missing_attributes_and_rows_are_accepted(faulty, tag):
    root, _, _ = faulty
    assert tag in set(_read(root, "validated", ACCEPTED[tag])[TAG])
    assert tag not in set(_read(root, "quarantine", ACCEPTED[tag])[TAG])


def test_counts_add_up_and_nothing_is_lost(faulty):
    root, raw, summary = faulty
    assert json.loads((root / "reports" / "summary.json").read_text()) == summary
    for name in TABLES:
        counts = summary["tables"][name]
        valid, quarantined = _read(root, "validated", name), _read(root, "quarantine", name)
        assert counts["rows_in"] == len(raw[name]) == counts["valid"] + counts["quarantined"]
        assert (counts["valid"], counts["quarantined"]) == (len(valid), len(quarantined))
        assert set(valid.columns) == set(raw[name].columns)
        assert set(quarantined.columns) == set(raw[name].columns) | {FAILED_COLUMN}
        assert sorted(valid[TAG].tolist() + quarantined[TAG].tolist()) == sorted(raw[name][TAG].tolist())
        assert quarantined[FAILED_COLUMN].map(len).gt(0).all()
        faults = raw[name][TAG].isin(list(FAULTS))
        assert quarantined[TAG].isin(list(FAULTS)).sum() == faults.sum()  # every fault caught
        assert sum(counts["failed_rows_by_expectation"].values()) >= counts["quarantined"] > 0
    # only faults (and outfits referencing them) are quarantined: clean articles and customers pass
    for name in ("articles", "customers"):
        assert set(_read(root, "quarantine", name)[TAG]) == {t for t, (table, _) in FAULTS.items() if table == name}


def test_too_much_quarantined_fails_with_a_clear_message(clean_raw, tmp_path):
    tables = _tables(clean_raw)
    o = tables["outfits"]
    o.loc[: len(o) // 10, "occasion"] = "brunch"  # 10% of outfits, above the default 5%
    _write(tmp_path, clean_raw, tables)
    (tmp_path / "validated").mkdir()
    (tmp_path / "validated" / "outfits.parquet").write_text("stale")
    too_many = r"10\.\d% of outfits quarantined, above validate\.max_quarantine_share 5\.0%"
    with pytest.raises(ContextualBertError, match=too_many):
        _run(tmp_path, ValidateConfig())
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert summary["passed"] is False and summary["tables"]["outfits"]["quarantined"] == len(o) // 10 + 1
    assert len(_read(tmp_path, "quarantine", "outfits")) == len(o) // 10 + 1
    assert not (tmp_path / "validated" / "outfits.parquet").exists()  # nothing stale left to build on


# --- CSV input --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sep, encoding", [(",", "utf-8"), (";", "utf-8-sig"), ("\t", "utf-8")])  # -sig: a BOM
def test_csv_input_with_list_columns_as_json_or_pipes(clean_raw, tmp_path, sep, encoding):
    tables = _tables(clean_raw)
    customers = tables["customers"].copy()
    for column in ("preferred_brands", "preferred_colors", "preferred_styles", "nogo_product_types"):
        as_json = customers[column].map(lambda v: json.dumps(list(v)))
        as_pipes = customers[column].map(lambda v: "|".join(v))
        customers[column] = as_json.where(customers.index % 2 == 0, as_pipes)
    customers = customers.astype({"age": object})
    customers.loc[0, "age"], customers.loc[0, TAG] = "old", "age_not_a_number"
    customers.loc[1, "preferred_brands"], customers.loc[1, TAG] = '["unclosed', "brands_not_a_list"
    (tmp_path / "raw").mkdir()
    shutil.copy(clean_raw / "schema.json", tmp_path / "raw")
    upper = {c: c.upper() for c in customers.columns if c != TAG}  # names in another letter case, any format
    customers.rename(columns=upper).to_csv(tmp_path / "raw" / "customers.csv", index=False, sep=sep, encoding=encoding)
    tables["articles"].to_parquet(tmp_path / "raw" / "articles.parquet", index=False)
    tables["outfits"].rename(columns={"article_ids": "Article_Ids"}).to_parquet(
        tmp_path / "raw" / "outfits.parquet", index=False
    )

    summary = _run(tmp_path)
    assert summary["tables"]["customers"]["file"].endswith("customers.csv")
    quarantined = _read(tmp_path, "quarantine", "customers").set_index(TAG)
    assert "expect_column_values_to_be_in_set(age__parsed)" in list(quarantined.loc["age_not_a_number", FAILED_COLUMN])
    assert quarantined.loc["age_not_a_number", "age"] == "old"  # kept as it was written
    assert "expect_column_values_to_be_in_set(preferred_brands__parsed)" in list(
        quarantined.loc["brands_not_a_list", FAILED_COLUMN]
    )
    assert summary["tables"]["customers"]["quarantined"] == 2
    # valid rows are typed like the Parquet the generator writes
    validated = pq.read_table(tmp_path / "validated" / "customers.parquet")
    original = pq.read_table(clean_raw / "customers.parquet")
    for column in original.column_names:
        assert validated.schema.field(column).type == original.schema.field(column).type, column
    assert validated.column("preferred_styles").to_pylist() == original.column("preferred_styles").to_pylist()[2:]


def test_imported_hm_fixture_validates(tmp_path):
    source = hm_fixture(tmp_path / "hm_source")
    customers = (source / "customers.csv").read_text()  # a status Kaggle's file does not have is a category
    (source / "customers.csv").write_text(
        customers.replace("c001,1.0,1.0,ACTIVE,Regularly", "c001,1.0,1.0,SUSPENDED,Weekly")
    )
    import_hm(source, tmp_path / "raw", ImportHMConfig())
    summary = _run(tmp_path, ValidateConfig())
    assert summary["tables"]["customers"]["quarantined"] == 0
    assert summary["source"] == "hm" and summary["passed"]
    assert summary["tables"]["outfits"]["valid"] == 5  # with c999 (no customer row) and c004 (an article without a row)
    assert (summary["tables"]["articles"]["valid"], summary["tables"]["articles"]["quarantined"]) == (12, 0)
    assert pd.isna(_read(tmp_path, "validated", "articles").set_index("article_id").loc["0110000001", "price"])
    customers = _read(tmp_path, "validated", "customers")
    assert customers["age"].isna().any() and customers["FN"].isna().any()  # missing context is allowed


# --- malformed input: one-line errors ---------------------------------------------------------------------


def _params(tmp_path: Path) -> Path:
    params = tmp_path / "params.yaml"
    paths = {k: str(tmp_path / v) for k, v in [("raw_dir", "raw"), ("validated_dir", "validated"),
             ("quarantine_dir", "quarantine"), ("reports_dir", "reports")]}  # fmt: skip
    params.write_text(yaml.safe_dump({"paths": paths}))
    return params


def _break_articles_price_to_text(raw: Path):
    table = pq.read_table(raw / "articles.parquet")
    index = table.column_names.index("price")
    pq.write_table(table.set_column(index, "price", pa.array(["cheap"] * table.num_rows)), raw / "articles.parquet")


def _int_customer_ids(raw: Path):
    table = pq.read_table(raw / "customers.parquet")
    ids = pa.array(np.arange(table.num_rows))
    pq.write_table(table.set_column(0, "customer_id", ids), raw / "customers.parquet")


def _rename(raw: Path, table: str, old: str, new: str):
    frame = pq.read_table(raw / f"{table}.parquet")
    pq.write_table(frame.rename_columns([new if c == old else c for c in frame.column_names]), raw / f"{table}.parquet")


LATIN1_CSV = b"article_id,product_type,brand,color,style,price\nA1,caf\xe9,b,c,s,2\n"
MALFORMED = {
    "missing file": (
        lambda raw: (raw / "outfits.parquet").unlink(),
        r"outfits: file not found: expected outfits\.parquet or outfits\.csv",
    ),
    "missing column": (
        lambda raw: pq.write_table(
            pq.read_table(raw / "articles.parquet").drop_columns(["style"]), raw / "articles.parquet"
        ),
        r"articles\.parquet, column 'style': required column missing",
    ),
    "misspelled column": (
        lambda raw: _rename(raw, "articles", "price", "prise"),
        r"articles\.parquet, column 'price': required column missing \(found 'prise': misspelled\?\)",
    ),
    "text where numbers belong": (
        _break_articles_price_to_text,
        r"articles\.parquet, column 'price': expected numbers, found text such as 'cheap'",
    ),
    "numbers where text belongs": (
        _int_customer_ids,
        r"customers\.parquet, column 'customer_id': expected text, found int64",
    ),
    "not parquet": (
        lambda raw: (raw / "articles.parquet").write_text("article_id,price\nA1,2.0\n"),
        r"articles\.parquet: not a readable Parquet file",
    ),
    "neither parquet nor csv": (
        lambda raw: (raw / "customers.parquet").rename(raw / "customers.json"),
        r"customers: file not found: .* \(found customers\.json: neither Parquet nor CSV\)",
    ),
    "empty table": (
        lambda raw: pq.write_table(pq.read_table(raw / "outfits.parquet").slice(0, 0), raw / "outfits.parquet"),
        r"outfits\.parquet: table is empty",
    ),
    "empty csv": (
        lambda raw: ((raw / "outfits.parquet").unlink(), (raw / "outfits.csv").write_text(""))[0],
        r"outfits\.csv: table is empty",
    ),
    "not utf-8": (
        lambda raw: ((raw / "articles.parquet").unlink(), (raw / "articles.csv").write_bytes(LATIN1_CSV))[0],
        r"articles\.csv: not UTF-8 text \(line 2",
    ),
    "missing schema": (lambda raw: (raw / "schema.json").unlink(), r"schema\.json: schema file not found"),
}


@pytest.mark.parametrize("fault", sorted(MALFORMED))
def test_malformed_input_is_a_one_line_cli_error(clean_raw, tmp_path, capsys, fault):
    shutil.copytree(clean_raw, tmp_path / "raw")
    breaker, message = MALFORMED[fault]
    breaker(tmp_path / "raw")
    assert main(["--params", str(_params(tmp_path)), "validate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("contextual-bert validate: error: ")
    assert re.search(message, err[0]), err[0]


def test_malformed_input_raises_data_error_naming_the_column(clean_raw, tmp_path):
    shutil.copytree(clean_raw, tmp_path / "raw")
    _rename(tmp_path / "raw", "outfits", "article_ids", "articles")
    with pytest.raises(DataError) as info:
        _run(tmp_path)
    assert info.value.column == "article_ids" and info.value.path.name == "outfits.parquet"


@pytest.mark.slow
def test_console_script_one_line_error_no_traceback(clean_raw, tmp_path):
    import subprocess
    import sys

    shutil.copytree(clean_raw, tmp_path / "raw")
    _rename(tmp_path / "raw", "customers", "customer_id", "customerid")
    result = subprocess.run(
        [sys.executable, "-m", "contextual_bert.cli", "--params", str(_params(tmp_path)), "validate"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "customers.parquet, column 'customer_id': required column missing" in result.stderr


@pytest.mark.parametrize(
    "setting, n_items, valid_at, quarantined_at", [("min_set_size", 3, 3, 4), ("max_set_size", 9, 10, 8)]
)
def test_the_outfit_size_limits_are_ingest_min_set_size_and_model_max_set_size(
    clean_raw, tmp_path, setting, n_items, valid_at, quarantined_at
):
    """One setting each: an outfit of 3 is valid with ingest.min_set_size 3 and quarantined with 4; one of 9
    is valid with model.max_set_size 10 and quarantined with 8."""
    tables = _tables(clean_raw)
    outfits, articles = tables["outfits"], tables["articles"]
    outfits.at[0, "article_ids"] = list(articles["article_id"][:n_items])
    for value, quarantined in ((valid_at, 0), (quarantined_at, 1)):
        root = tmp_path / str(value)
        _write(root, clean_raw, tables)
        summary = validate(
            root / "raw", root / "validated", root / "quarantine", root / "reports", LENIENT, **{setting: value}
        )
        assert summary["tables"]["outfits"]["quarantined"] == quarantined, (setting, value)


# --- the outfits' optional date ---------------------------------------------------------------------------


def test_a_null_or_unparseable_date_quarantines_the_outfit_with_its_reason(clean_raw, tmp_path):
    """The date column as text (a CSV's or an export's): ISO dates parse to date32, a null one and one that is
    no date are quarantined, each with its own expectation; counts add up."""
    tables = _tables(clean_raw)
    o = tables["outfits"]
    o[DATE_COLUMN] = [f"2021-03-{1 + i % 28:02d}" for i in range(len(o))]
    o.loc[0, [DATE_COLUMN, TAG]] = ["not a date", "unparseable"]
    o.loc[1, [DATE_COLUMN, TAG]] = [None, "null"]
    o.loc[2, [DATE_COLUMN, TAG]] = ["2021-02-30", "unparseable"]  # no such day
    _write(tmp_path, clean_raw, tables)
    summary = _run(tmp_path)
    counts = summary["tables"]["outfits"]
    assert counts["rows_in"] == len(o) == counts["valid"] + counts["quarantined"]
    assert counts["quarantined"] == 3
    quarantined = _read(tmp_path, "quarantine", "outfits").set_index(TAG)
    parsed, not_null = (
        f"expect_column_values_to_be_in_set({DATE_COLUMN}__parsed)",
        f"expect_column_values_to_not_be_null({DATE_COLUMN})",
    )
    for failed in quarantined.loc[["unparseable"], FAILED_COLUMN]:
        assert parsed in list(failed)
    assert list(quarantined.loc[["null"], FAILED_COLUMN].iloc[0]) == [not_null]
    assert quarantined.loc["unparseable", DATE_COLUMN].tolist() == ["not a date", "2021-02-30"]  # as read
    valid = pq.read_table(tmp_path / "validated" / "outfits.parquet")
    assert valid.schema.field(DATE_COLUMN).type == DATE_TYPE
    assert valid.column(DATE_COLUMN).null_count == 0
    assert str(valid.column(DATE_COLUMN)[0]) == "2021-03-04"  # row 3's


def test_without_a_date_column_the_outfits_have_none(clean_raw, tmp_path):
    tables = _tables(clean_raw)
    tables["outfits"] = tables["outfits"].drop(columns=[DATE_COLUMN], errors="ignore")
    _write(tmp_path, clean_raw, tables)
    summary = _run(tmp_path, ValidateConfig())
    assert summary["tables"]["outfits"]["quarantined"] == 0
    assert DATE_COLUMN not in pq.read_table(tmp_path / "validated" / "outfits.parquet").column_names
