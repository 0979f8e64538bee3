"""The H&M importer, on a hand-written fixture and on the real sample rows (when present)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from helpers import hm_fixture

from contextual_bert.config import ImportHMConfig
from contextual_bert.data.contract import DATE_COLUMN, DATE_TYPE, HM_SCHEMA, IMPORT_QUARANTINE, DataSchema
from contextual_bert.data.sources.hm import _article_id_sql, import_hm
from contextual_bert.data.sources.hm_files import ARTICLES, CUSTOMERS, TRANSACTIONS
from contextual_bert.errors import DataError

HM_SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "hm_sample"


@pytest.fixture(scope="module")
def fixture_import(tmp_path_factory):
    out = tmp_path_factory.mktemp("hm_raw")
    report = import_hm(hm_fixture(tmp_path_factory.mktemp("hm_source")), out, ImportHMConfig())
    return out, report


def normalize_article_ids(ids: pd.Series) -> pd.Series:
    """H&M article ids through the importer's own SQL expression."""
    import duckdb

    frame = pd.DataFrame({"id": ids.astype("string")})  # noqa: F841 - DuckDB's SQL reads it by its name
    with duckdb.connect() as con:
        out = con.execute(f"SELECT {_article_id_sql('id')} AS id FROM frame").df()["id"]
    return out.astype("string").set_axis(ids.index)


def test_article_ids_normalized_to_ten_digits():
    ids = pd.Series(["108775015", "0108775015", " 108775015 ", "108775015.0", None, "abc"])
    assert normalize_article_ids(ids).tolist() == ["0108775015"] * 4 + [pd.NA, "abc"]
    assert normalize_article_ids(pd.Series([108775015, 9999])).tolist() == ["0108775015", "0000009999"]


def test_fixture_baskets_kept_and_dropped_per_reason(fixture_import):
    out, report = fixture_import
    assert report["baskets"] == 7
    # c999 has no customer row and c004 bought an article without an article row: kept, attributes missing
    assert report["baskets_kept"] == 5
    assert report["baskets_dropped"] == {"too_small": 1, "too_large": 1}
    assert report["baskets_kept"] + sum(report["baskets_dropped"].values()) == report["baskets"]
    assert report["outfits_without_customer_row"] == 1
    assert (report["outfits_with_articles_without_row"], report["articles_without_row"]) == (1, 1)
    assert report["transactions"] == 39 and report["transactions_malformed_dropped"] == 1
    assert report["articles_without_price"] == 1  # the scarf nobody bought: kept, its price missing
    assert json.loads((out / "ingest_report.json").read_text()) == report


def test_basket_definitions(tmp_path):
    """c001 bought 5 articles on the 20th and 3 on the 21st (same week): one 8-article basket by week or by
    session, a kept and a too-small one by day. The report counts every definition whichever is chosen."""
    by = {}
    for basket in ("day", "week", "session"):
        cfg = ImportHMConfig(basket=basket)
        report = import_hm(hm_fixture(tmp_path / "hm"), tmp_path / basket, cfg)
        outfits = pd.read_parquet(tmp_path / basket / "outfits.parquet")
        by[basket] = (report, dict(zip(outfits["outfit_id"], outfits["article_ids"].map(len))))
    day, week, session = (by[b][1] for b in ("day", "week", "session"))
    assert day["c001_2018-09-20"] == 5 and "c001_2018-09-21" not in day
    assert week["c001_w2018-09-17"] == 8 and session["c001_s2018-09-20"] == 8
    assert by["day"][0]["baskets"] == 7 and by["week"][0]["baskets"] == 6
    assert by["week"][0]["baskets_dropped"] == {"too_small": 0, "too_large": 1}
    counts = by["day"][0]["outfits_by_basket_definition"]
    assert counts == {"day": 5, "week": 5, "session_gap_1d": 5}
    assert all(r["outfits_by_basket_definition"] == counts for r, _ in by.values())
    assert by["session"][0]["basket"] == {"by": "session", "session_gap_days": 1}


def test_an_outfit_is_dated_by_its_basket_s_first_day(tmp_path):
    """The date column (date32): the day of a day basket, the Monday of a week basket, the first purchase day
    of a session (c001 bought on the 20th and the 21st: the week of the 17th, the session of the 20th)."""
    expected = {
        "day": ("c001_2018-09-20", "2018-09-20"),
        "week": ("c001_w2018-09-17", "2018-09-17"),
        "session": ("c001_s2018-09-20", "2018-09-20"),
    }
    source = hm_fixture(tmp_path / "hm")
    for basket, (outfit_id, day) in expected.items():
        import_hm(source, tmp_path / basket, ImportHMConfig(basket=basket))
        table = pq.read_table(tmp_path / basket / "outfits.parquet")
        assert table.schema.field(DATE_COLUMN).type == DATE_TYPE
        dates = dict(zip(table.column("outfit_id").to_pylist(), table.column(DATE_COLUMN).to_pylist()))
        assert str(dates[outfit_id]) == day, basket
        # every outfit's date is the day its id names
        assert all(i.endswith(str(d)) for i, d in dates.items())


def test_articles_without_optional_columns(tmp_path):
    source = hm_fixture(tmp_path / "hm")
    articles = pd.read_csv(source / "articles.csv", dtype=str)
    articles.drop(columns=["section_name", "graphical_appearance_name", "prod_name"]).to_csv(
        source / "articles.csv", index=False
    )
    customers = pd.read_csv(source / "customers.csv", dtype=str)
    customers.drop(columns=["postal_code"]).to_csv(source / "customers.csv", index=False)
    report = import_hm(source, tmp_path / "out", ImportHMConfig())
    assert report["columns_missing"] == {
        "articles.csv": ["section_name", "graphical_appearance_name", "prod_name"],
        "customers.csv": ["postal_code"],
    }
    assert report["baskets_kept"] == 5
    out = pd.read_parquet(tmp_path / "out" / "articles.parquet")
    assert out["brand"].isna().all() and out["style"].isna().all() and out["color"].notna().all()
    assert pd.read_parquet(tmp_path / "out" / "customers.parquet")["postal_code"].isna().all()


def test_transactions_without_price_import_the_same_baskets_unpriced(tmp_path, fixture_import):
    """price only prices the articles: a transactions file without it (or without sales_channel_id) gives the
    same outfits, every article's price missing, and the report says which column was absent."""
    source = hm_fixture(tmp_path / "hm")
    tx = pd.read_csv(source / TRANSACTIONS, dtype=str)
    tx.drop(columns=["price", "sales_channel_id"]).to_csv(source / TRANSACTIONS, index=False)
    report = import_hm(source, tmp_path / "out", ImportHMConfig())
    assert report["columns_missing"] == {TRANSACTIONS: ["price"]}
    full, _ = fixture_import
    assert pq.read_table(tmp_path / "out" / "outfits.parquet").equals(pq.read_table(full / "outfits.parquet"))
    articles = pd.read_parquet(tmp_path / "out" / "articles.parquet")
    assert articles["price"].isna().all() and report["articles_without_price"] == len(articles)
    priced = pd.read_parquet(full / "articles.parquet")
    assert articles.drop(columns="price").equals(priced.drop(columns="price"))


def test_fixture_outfits_follow_the_contract(fixture_import):
    out, _ = fixture_import
    assert DataSchema.load(out) == HM_SCHEMA
    outfits = pd.read_parquet(out / "outfits.parquet")
    assert str(pq.read_schema(out / "outfits.parquet").field("article_ids").type) == "list<element: string>"
    by_id = dict(zip(outfits["outfit_id"], outfits["article_ids"].map(list)))
    # c001 bought 0101000001 twice that day (written with and without the leading zero): counted once
    assert by_id["c001_2018-09-20"] == ["0101000001", "0102000001", "0103000001", "0104000001", "0105000001"]
    assert by_id["c003_2018-09-22"] == ["0101000002", "0102000002", "0108000001", "0109000001"]
    assert len(by_id["c005_2018-09-20"]) == 8  # the upper bound is kept
    assert set(outfits["customer_id"]) == {"c001", "c003", "c004", "c005", "c999"}
    assert by_id["c004_2018-09-23"][-1] == "0999999999"  # no row in articles.csv: kept all the same


def test_fixture_articles_and_customers_mapped(fixture_import):
    out, _ = fixture_import
    articles = pd.read_parquet(out / "articles.parquet").set_index("article_id")
    assert articles.index.str.fullmatch(r"\d{10}").all()
    top = articles.loc["0101000001"]
    assert (top["product_type"], top["brand"], top["color"], top["style"]) == (
        "Vest top", "Womens Everyday Basics", "Black", "Solid"
    )  # fmt: skip
    # mean transaction price over all its purchases, whichever basket they fell in
    assert top["price"] == pytest.approx((0.0100 * 5 + 0.0140) / 6)
    scarf = articles.loc["0110000001"]  # never sold: in the catalogue all the same, its price missing
    assert scarf["product_type"] == "Scarf" and pd.isna(scarf["price"])
    customers = pd.read_parquet(out / "customers.parquet").set_index("customer_id")
    assert customers["age"].dtype == "float64" and pd.isna(customers.loc["c003", "age"])
    assert customers.loc["c001", "FN"] == "1" and pd.isna(customers.loc["c002", "FN"])
    assert pd.isna(customers.loc["c004", "club_member_status"])
    assert list(customers.columns) == [c.name for c in HM_SCHEMA.context_columns]


def test_min_max_items_from_config(tmp_path):
    report = import_hm(hm_fixture(tmp_path / "hm"), tmp_path / "out", ImportHMConfig(), max_set_size=9, min_set_size=3)
    assert report["baskets_kept"] == 7  # the 3-item and the 9-item baskets now count
    assert report["baskets_dropped"]["too_small"] == 0 and report["baskets_dropped"]["too_large"] == 0


def test_missing_file_and_column_are_one_line_errors(tmp_path):
    source = hm_fixture(tmp_path / "hm")
    pristine = hm_fixture(tmp_path / "pristine")
    (source / "articles.csv").unlink()
    with pytest.raises(DataError, match=r"articles\.csv.*file not found"):
        import_hm(source, tmp_path / "out", ImportHMConfig())
    shutil.copy(pristine / "articles.csv", source)
    text = (source / "articles.csv").read_text().replace("article_id", "articleid", 1)
    (source / "articles.csv").write_text(text)
    with pytest.raises(DataError, match=r"articles\.csv, column 'article_id': required column missing"):
        import_hm(source, tmp_path / "out", ImportHMConfig())
    header = (pristine / "articles.csv").read_bytes().splitlines()[0]
    (source / "articles.csv").write_bytes(header + b"\n" + b"1,caf\xe9" + b"," * 24 + b"\n")
    with pytest.raises(DataError, match="not UTF-8"):
        import_hm(source, tmp_path / "out", ImportHMConfig())


def test_without_a_customers_file_the_same_outfits_import_without_context(tmp_path, fixture_import):
    out, report = fixture_import
    source = hm_fixture(tmp_path / "hm")
    (source / "customers.csv").unlink()
    alone = import_hm(source, tmp_path / "out", ImportHMConfig())
    assert DataSchema.load(tmp_path / "out").context_columns == ()
    assert pq.read_table(tmp_path / "out" / "outfits.parquet").equals(pq.read_table(out / "outfits.parquet"))
    assert pq.read_table(tmp_path / "out" / "customers.parquet").column_names == ["customer_id"]
    assert CUSTOMERS not in alone["files"] and CUSTOMERS not in alone["columns_missing"]
    assert alone["customers_rows"] == 0 and alone["rows"]["outfits"] == report["rows"]["outfits"]


def test_lines_that_cannot_be_read_or_used_are_quarantined_with_their_line(tmp_path):
    source = hm_fixture(tmp_path / "hm")
    tx = (source / TRANSACTIONS).read_text().splitlines()
    bad_tx = {
        "2018-13-45,c001,109000001,0.0100,2": ("t_dat", "not a date"),
        "2018-09-20,c002,101000001,0.0100,2,extra": (None, "too many fields"),
        "2018-09-20,c002,101000001": ("price", "too few fields"),
        "2018-09-20,c001,,0.0100,2": ("article_id", "no article id"),
    }
    for at, line in zip((3, 9, 20, len(tx) + 3), bad_tx):  # in between the fixture's rows, which stay as they were
        tx.insert(at, line)
    (source / TRANSACTIONS).write_text("\n".join(tx) + "\n")
    customers = (source / CUSTOMERS).read_text() + ",1.0,,ACTIVE,NONE,30.0,pc-zz\n"
    (source / CUSTOMERS).write_bytes(b"\xef\xbb\xbf" + customers.encode())  # with a byte-order mark
    articles = (source / ARTICLES).read_text().splitlines()  # with an unnamed index column, as pandas writes
    articles = [f"{i - 1 if i else ''},{line}" for i, line in enumerate(articles)]
    (source / ARTICLES).write_bytes("\n".join(articles).encode() + b"\n99,1,caf\xe9" + b"," * 24 + b"\n")

    report = import_hm(source, tmp_path / "out", ImportHMConfig())
    assert report["baskets_kept"] == 5 and report["rows"]["articles"] == 12  # as from the clean fixture
    quarantine = pq.read_table(tmp_path / "out" / IMPORT_QUARANTINE).to_pylist()
    got = [(r["file"], r["line"], r["column"], r["reason"].split(" (")[0]) for r in quarantine]
    tx_line = {text: tx.index(text) + 1 for text in bad_tx}
    assert got == [
        (ARTICLES, len(articles) + 1, "product_code", "not UTF-8 text"),
        (CUSTOMERS, len(customers.splitlines()), "customer_id", "no customer id"),
        *sorted(
            [(TRANSACTIONS, tx_line[text], column, reason) for text, (column, reason) in bad_tx.items()]
            + [(TRANSACTIONS, tx.index("2018-09-20,,107000001,0.0060,2") + 1, "customer_id", "no customer id")],
            key=lambda r: r[1],
        ),
    ]
    assert {r["text"] for r in quarantine if r["file"] == TRANSACTIONS} >= set(bad_tx)  # as written
    # counts add up: lines = rows read + lines not read; quarantined = lines not read + rows read but unusable
    assert report["transactions"] + report["lines_rejected"][TRANSACTIONS] == len(tx) - 1
    assert report["customers_rows"] + report["lines_rejected"][CUSTOMERS] == len(customers.splitlines()) - 1
    assert report["articles_rows"] + report["lines_rejected"][ARTICLES] == len(articles)
    assert (
        report["quarantined"]["rows"]
        == len(quarantine)
        == sum(report["lines_rejected"].values())
        + sum(
            report[k]
            for k in ("transactions_malformed_dropped", "customers_without_id_dropped", "articles_without_id_dropped")
        )
    )


def test_an_import_without_an_outfit_is_a_one_line_error(tmp_path):
    source = hm_fixture(tmp_path / "hm")
    rows = (source / TRANSACTIONS).read_text().splitlines()
    (source / TRANSACTIONS).write_text("\n".join(rows[:3]) + "\n")  # one basket of two articles
    with pytest.raises(
        DataError,
        match=r"hm: no outfit kept: of 1 baskets \(import_hm.basket: day\) none has "
        r"4-8 distinct articles \(1 too small, 0 too large\)",
    ):
        import_hm(source, tmp_path / "out", ImportHMConfig())
    report = json.loads((tmp_path / "out" / "ingest_report.json").read_text())  # written: why, to read
    assert report["baskets_kept"] == 0 and report["baskets_dropped"]["too_small"] == report["baskets"] == 1


def test_a_file_with_nothing_usable_is_a_one_line_error(tmp_path):
    source = hm_fixture(tmp_path / "hm")
    pristine = (source / TRANSACTIONS).read_text()
    rows = pristine.splitlines()
    (source / TRANSACTIONS).write_text("\n".join([rows[0], *(",".join(r.split(",")[:3]) for r in rows[1:]), ""]))
    with pytest.raises(
        DataError,
        match=r"transactions_train\.csv, column 'price': line 2: too few fields .*"
        "no line of the file could be read",
    ):
        import_hm(source, tmp_path / "out", ImportHMConfig())
    (source / TRANSACTIONS).write_text(pristine.replace("2018-09-", "20/09/"))
    with pytest.raises(DataError, match=r"transactions_train\.csv, column 't_dat': line 2: not a date"):
        import_hm(source, tmp_path / "out", ImportHMConfig())
    (source / TRANSACTIONS).write_text(pristine.replace("sales_channel_id", "price", 1))
    with pytest.raises(DataError, match=r"column 'price': column named twice"):
        import_hm(source, tmp_path / "out", ImportHMConfig())


@pytest.mark.parametrize("delim", [";", "\t", "|"])
def test_other_delimiters_decimal_commas_and_iso_date_times_import_as_the_kaggle_files(tmp_path, fixture_import, delim):
    source = hm_fixture(tmp_path / "hm")
    for name in (TRANSACTIONS, CUSTOMERS, ARTICLES):  # the fixture has no quoted field: a plain swap
        rows = [line.split(",") for line in (source / name).read_text().splitlines()]
        if name == TRANSACTIONS:  # dates as ISO date-times, times and zones that must not move the day
            times = ["T23:59:59+02:00", " 00:00:00", "T10:15", " 23:30:00.123Z", ""]
            rows = [
                rows[0],
                *(
                    [r[0] + times[i % len(times)], *r[1:3], r[3].replace(".", ","), *r[4:]]
                    for i, r in enumerate(rows[1:])
                ),
            ]  # and prices with a decimal comma
        if name == CUSTOMERS:  # ages and flags with a decimal comma
            rows = [
                rows[0],
                *(
                    [r[0], *(v.replace(".", ",") for v in r[1:3]), *r[3:5], r[5].replace(".", ","), *r[6:]]
                    for r in rows[1:]
                ),
            ]
        (source / name).write_text("\n".join(delim.join(r) for r in rows) + "\n")
    (source / TRANSACTIONS).write_text(
        (source / TRANSACTIONS).read_text() + delim.join(["2018-09-20 noon", "c001", "101000001", "0.0100", "2"]) + "\n"
    )
    report = import_hm(source, tmp_path / "out", ImportHMConfig())
    clean_out, clean = fixture_import
    for table in ("outfits", "articles", "customers"):
        assert pq.read_table(tmp_path / "out" / f"{table}.parquet").equals(
            pq.read_table(clean_out / f"{table}.parquet")
        )
    assert report["transactions_malformed_dropped"] == clean["transactions_malformed_dropped"] + 1
    bad = pq.read_table(tmp_path / "out" / IMPORT_QUARANTINE).to_pylist()[-1]
    assert (bad["column"], bad["reason"].split(" (")[0], bad["text"]) == (
        "t_dat",
        "not a date",
        delim.join(["2018-09-20 noon", "c001", "101000001", "0.0100", "2"]),
    )


@pytest.mark.parametrize(
    "date_format, write",
    [
        ("%d/%m/%Y", lambda y, m, d: f"{d}/{m}/{y}"),
        ("%m/%d/%Y %H:%M", lambda y, m, d: f"{int(m)}/{int(d)}/{y} 23:59"),
        ("%Y%m%d", lambda y, m, d: f"{y}{m}{d}"),
    ],
)
def test_another_date_form_imports_as_the_kaggle_files_with_date_format(tmp_path, fixture_import, date_format, write):
    source = hm_fixture(tmp_path / "hm")
    header, *rows = (source / TRANSACTIONS).read_text().splitlines()
    rows = [",".join([write(*r.split(",")[0].split("-")), *r.split(",")[1:]]) for r in rows]
    rows[1] = "2018-09-20" + rows[1][rows[1].index(",") :]  # an ISO date is always read
    (source / TRANSACTIONS).write_text("\n".join([header, *rows, "31/31/2018,c001,101000001,0.0100,2"]) + "\n")
    with pytest.raises(DataError, match="no outfit kept"):  # without the format only the ISO date is read
        import_hm(source, tmp_path / "iso", ImportHMConfig())
    assert pq.read_table(tmp_path / "iso" / IMPORT_QUARANTINE).to_pylist()[0]["reason"] == (
        "not a date (YYYY-MM-DD, or an ISO date and time; another form: set import_hm.date_format)"
    )
    report = import_hm(source, tmp_path / "out", ImportHMConfig(date_format=date_format))
    clean_out, clean = fixture_import
    for table in ("outfits", "articles", "customers"):
        assert pq.read_table(tmp_path / "out" / f"{table}.parquet").equals(
            pq.read_table(clean_out / f"{table}.parquet")
        )
    bad = pq.read_table(tmp_path / "out" / IMPORT_QUARANTINE).to_pylist()[-1]
    assert (bad["line"], bad["reason"]) == (
        len(rows) + 2,
        f"not a date (YYYY-MM-DD, an ISO date and time, or import_hm.date_format '{date_format}')",
    )
    assert report["transactions_malformed_dropped"] == clean["transactions_malformed_dropped"] + 1
    with pytest.raises(DataError, match=r"import_hm.date_format '%Q' is not a strptime format"):
        import_hm(source, tmp_path / "bad", ImportHMConfig(date_format="%Q"))


def test_column_names_in_another_letter_case_import_as_the_kaggle_files(tmp_path, fixture_import):
    source = hm_fixture(tmp_path / "hm")
    for name, case in ((TRANSACTIONS, str.upper), (CUSTOMERS, str.lower), (ARTICLES, str.title)):
        header, rest = (source / name).read_text().split("\n", 1)
        (source / name).write_text(case(header) + "\n" + rest)
    import_hm(source, tmp_path / "out", ImportHMConfig())
    clean_out, _ = fixture_import
    for table in ("outfits", "articles", "customers"):
        assert pq.read_table(tmp_path / "out" / f"{table}.parquet").equals(
            pq.read_table(clean_out / f"{table}.parquet")
        )
    header, rest = (source / CUSTOMERS).read_text().split("\n", 1)  # the same column twice but for case
    (source / CUSTOMERS).write_text(header + ",FN\n" + rest.replace("\n", ",1\n"))
    with pytest.raises(DataError, match=r"customers\.csv, column 'FN': column named twice"):
        import_hm(source, tmp_path / "out2", ImportHMConfig())


def _as_parquet(csv_path: Path) -> Path:
    """The file as a Parquet file with the types a user's conversion gives (pandas' read_csv: integer article
    ids, a timestamp t_dat, float prices, ages and flags); the CSV is removed."""
    frame = pd.read_csv(csv_path, parse_dates=["t_dat"] if csv_path.name == TRANSACTIONS else False)
    frame.to_parquet(csv_path.with_suffix(".parquet"), index=False)
    csv_path.unlink()
    return csv_path.with_suffix(".parquet")


def test_gzipped_and_parquet_files_import_as_the_kaggle_files(tmp_path, fixture_import):
    import gzip

    source = hm_fixture(tmp_path / "hm")
    gz = source / f"{TRANSACTIONS}.gz"
    lines = (source / TRANSACTIONS).read_text().splitlines()
    lines.insert(5, "2018-09-20,c002,101000001,0.0100,2,extra")  # line 6: unreadable, quarantined as the .gz's
    gz.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    (source / TRANSACTIONS).unlink()
    for name in (CUSTOMERS, ARTICLES):
        _as_parquet(source / name)
    report = import_hm(source, tmp_path / "out", ImportHMConfig())
    clean_out, clean = fixture_import
    for table in ("outfits", "articles", "customers"):
        assert pq.read_table(tmp_path / "out" / f"{table}.parquet").equals(
            pq.read_table(clean_out / f"{table}.parquet")
        )
    assert report["files"] == {TRANSACTIONS: gz.name, CUSTOMERS: "customers.parquet", ARTICLES: "articles.parquet"}
    bad = pq.read_table(tmp_path / "out" / IMPORT_QUARANTINE).to_pylist()
    assert (gz.name, 6, "too many fields") in [(r["file"], r["line"], r["reason"].split(" (")[0]) for r in bad]
    assert report["lines_rejected"][TRANSACTIONS] == 1

    gz.unlink()  # every file Parquet; a transaction without a customer is quarantined at its row
    frame = pd.read_csv(hm_fixture(tmp_path / "csv") / TRANSACTIONS, parse_dates=["t_dat"])
    frame.loc[3, "customer_id"] = None
    frame.to_parquet(source / "transactions_train.parquet", index=False)
    report = import_hm(source, tmp_path / "out2", ImportHMConfig())
    bad = pq.read_table(tmp_path / "out2" / IMPORT_QUARANTINE).to_pylist()
    rows = [i + 1 for i in frame.index[frame["customer_id"].isna()]]  # the 4th and the fixture's own
    parquet = "transactions_train.parquet"
    assert rows[0] == 4 and [(r["file"], r["line"], r["column"]) for r in bad if r["file"] == parquet] == [
        (parquet, row, "customer_id") for row in rows
    ]
    assert report["transactions_malformed_dropped"] == clean["transactions_malformed_dropped"] + 1


def test_a_parquet_t_dat_with_a_time_zone_gives_its_utc_day_on_any_machine(tmp_path, fixture_import):
    import subprocess
    import sys

    source = hm_fixture(tmp_path / "hm")
    frame = pd.read_csv(source / TRANSACTIONS, parse_dates=["t_dat"])
    frame["t_dat"] = frame["t_dat"].dt.tz_localize("UTC") + pd.Timedelta(hours=23, minutes=30)  # late in the day
    frame.to_parquet(source / "transactions_train.parquet", index=False)
    (source / TRANSACTIONS).unlink()
    code = (
        "import sys; from contextual_bert.data.sources.hm import import_hm; "
        "from contextual_bert.config import ImportHMConfig; import_hm(sys.argv[1], sys.argv[2], ImportHMConfig())"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(source), str(tmp_path / "out")],
        check=True,
        env={**os.environ, "TZ": "Pacific/Auckland"},
    )  # where 23:30 UTC is the next day
    clean_out, _ = fixture_import
    assert pq.read_table(tmp_path / "out" / "outfits.parquet").equals(pq.read_table(clean_out / "outfits.parquet"))


def test_two_copies_of_a_file_or_a_broken_one_is_a_one_line_error(tmp_path):
    source = hm_fixture(tmp_path / "hm")
    (source / "articles.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(
        DataError,
        match=r"articles\.csv: articles\.csv and articles\.parquet both hold articles: "
        "keep one",
    ):
        import_hm(source, tmp_path / "out", ImportHMConfig())
    (source / ARTICLES).unlink()
    with pytest.raises(DataError, match=r"articles\.parquet: not a Parquet file"):
        import_hm(source, tmp_path / "out", ImportHMConfig())
    (source / "articles.parquet").unlink()
    with pytest.raises(DataError, match=r"articles\.csv: file not found \(.*articles\.csv\.gz or articles\.parquet\)"):
        import_hm(source, tmp_path / "out", ImportHMConfig())
    (source / f"{ARTICLES}.gz").write_bytes(b"not gzip")
    with pytest.raises(DataError, match=r"articles\.csv\.gz: not a readable gzip file"):
        import_hm(source, tmp_path / "out", ImportHMConfig())


def test_a_header_row_no_delimiter_splits_into_the_required_columns_is_an_error(tmp_path):
    source = hm_fixture(tmp_path / "hm")
    (source / TRANSACTIONS).write_text((source / TRANSACTIONS).read_text().replace(",", " "))
    with pytest.raises(DataError, match=r"transactions_train\.csv, column 't_dat': required column missing"):
        import_hm(source, tmp_path / "out", ImportHMConfig())


def test_an_articles_mean_price_does_not_depend_on_the_order_of_its_transactions(tmp_path):
    """As doubles, (0.1 + 0.2 + 0.3) / 3 and (0.3 + 0.2 + 0.1) / 3 differ in the last bit; a parallel sum adds in
    a varying order, so the same files gave different articles.parquet bytes from run to run at the full size."""
    prices = {}
    for order in ("0.1 -0.5 0.2 0.3", "0.3 0.2 0.1 -0.5"):  # -0.5: a return, not a price
        source = hm_fixture(tmp_path / order)
        extra = "".join(f"2018-09-25,c009,110000001,{p},2\n" for p in order.split())  # sold nowhere else
        (source / TRANSACTIONS).write_text((source / TRANSACTIONS).read_text() + extra)
        import_hm(source, tmp_path / f"out {order}", ImportHMConfig())
        articles = pd.read_parquet(tmp_path / f"out {order}" / "articles.parquet").set_index("article_id")
        prices[order] = articles.loc["0110000001", "price"]
    assert prices["0.1 -0.5 0.2 0.3"] == prices["0.3 0.2 0.1 -0.5"] == pytest.approx(0.2, rel=1e-15)


@pytest.mark.skipif(not HM_SAMPLE.is_dir(), reason="the H&M sample (../shared/data/hm_sample) is absent")
def test_real_sample(tmp_path):
    report = import_hm(HM_SAMPLE, tmp_path, ImportHMConfig())
    transactions = pd.read_csv(HM_SAMPLE / "transactions_train.csv", dtype=str)
    assert report["transactions"] == len(transactions)
    assert report["baskets"] == transactions.groupby(["customer_id", "t_dat"]).ngroups
    assert report["baskets_kept"] + sum(report["baskets_dropped"].values()) == report["baskets"]
    assert report["baskets_kept"] > 0 and report["outfits_without_customer_row"] > 0  # the sample is messy

    outfits = pd.read_parquet(tmp_path / "outfits.parquet")
    customers = pd.read_parquet(tmp_path / "customers.parquet")
    articles = pd.read_parquet(tmp_path / "articles.parquet")
    assert len(outfits) == report["baskets_kept"] and outfits["outfit_id"].is_unique
    sizes = outfits["article_ids"].map(len)
    assert sizes.between(4, 8).all() and (outfits["article_ids"].map(lambda a: len(set(a))) == sizes).all()
    assert (~outfits["customer_id"].isin(customers["customer_id"])).sum() == report["outfits_without_customer_row"]
    assert outfits["article_ids"].explode().isin(articles["article_id"]).all()
    assert articles["article_id"].str.fullmatch(r"\d{10}").all() and (articles["price"] > 0).all()
    assert customers["age"].dtype == "float64" and customers["age"].isna().any()  # missing ages stay missing


@pytest.mark.skipif(not HM_SAMPLE.is_dir(), reason="the H&M sample (../shared/data/hm_sample) is absent")
def test_real_sample_with_30_percent_of_articles_removed_drops_no_basket_for_it(tmp_path):
    """Users sample articles and transactions separately: a missing article (or customer) row leaves its
    attributes missing, it never drops the basket. Only too_small / too_large drop one."""
    full = import_hm(HM_SAMPLE, tmp_path / "full", ImportHMConfig())
    source = tmp_path / "cut"
    source.mkdir()
    for name in ("transactions_train.csv", "customers.csv"):
        shutil.copy(HM_SAMPLE / name, source)
    articles = pd.read_csv(HM_SAMPLE / "articles.csv", dtype=str, keep_default_na=False)
    kept_rows = articles.sample(frac=0.7, random_state=0).sort_index()
    kept_rows.to_csv(source / "articles.csv", index=False)
    report = import_hm(source, tmp_path / "out", ImportHMConfig())

    assert set(report["baskets_dropped"]) == {"too_small", "too_large"}
    assert report["baskets"] == full["baskets"] and report["baskets_kept"] == full["baskets_kept"]
    assert report["baskets_dropped"] == full["baskets_dropped"]
    assert report["baskets_kept"] + sum(report["baskets_dropped"].values()) == report["baskets"]
    assert report["outfits_with_articles_without_row"] > 0 and report["articles_without_row"] > 0
    assert report["rows"]["articles"] < full["rows"]["articles"]
    outfits = pd.read_parquet(tmp_path / "out" / "outfits.parquet")
    unknown = ~outfits["article_ids"].explode().isin(
        pd.read_parquet(tmp_path / "out" / "articles.parquet")["article_id"]
    )
    assert unknown.groupby(level=0).any().sum() == report["outfits_with_articles_without_row"]
