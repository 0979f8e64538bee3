"""Import the H&M Kaggle files ("H&M Personalized Fashion Recommendations") into the raw data contract.

An outfit is a basket: the distinct articles one customer bought on one day (`import_hm.basket: day`),
in one week, Monday to Sunday (`week`), or in one session, purchase days at most `session_gap_days` apart
(`session`). A basket becomes an outfit when it has `ingest.min_set_size`..`model.max_set_size` articles;
every other basket is dropped and counted as too_small or too_large (baskets = kept + dropped). A basket
whose customer has no row in customers.csv, or whose articles have no row in articles.csv, is kept: those
attributes are missing, and ingest_report.json counts such outfits. A transaction without a readable
customer, date or article id is dropped and counted (transactions = used + malformed). The report also gives
how many outfits each basket definition yields, so the choice can be made with the numbers at hand.
Each outfit's date (contract.DATE_COLUMN, date32) is its basket's first day (BASKET_START, as in its outfit id):
the day for `day`, the Monday for `week`, the first purchase day for `session`.

Nothing is dropped unseen: the import quarantine (contract.IMPORT_QUARANTINE), beside the tables, holds every source line the import
could not use, with its file, line, column, reason and text: lines that cannot be read as CSV (too many or
too few fields, a quote left open, bytes that are not UTF-8), which are skipped rather than failing the
file, and rows without a customer id, a date or an article id. The report counts them per file (lines =
rows read + lines rejected; quarantined = lines rejected + rows without an id or date). A file of which no
line can be read, or transactions none of which are usable, is a one-line error naming the first bad line.

Column mapping (H&M has no brand and no style; the nearest columns stand in, and the report says so):
  product_type <- product_type_name    brand <- section_name (H&M's own lines, e.g. "Divided", "H&M+")
  color <- colour_group_name           style <- graphical_appearance_name (solid, stripe, denim, ...)
  price <- the mean transaction price of the article (H&M publishes prices scaled, not in euros), missing
           for an article never sold: it is kept, and a model with attributes can rank it
Only the id columns (and t_dat) are required; an absent attribute, customer or price column is missing for every
row (the report lists such columns). Each file may be stored as Kaggle's CSV, gzipped (.csv.gz) or as Parquet
(its typed columns read as text, then parsed as a CSV's). Fields are separated by commas, as in Kaggle's files,
or by ';', a tab or '|' (contract.read_header: the first that splits the header row into the required columns; in
such a file a number may have a decimal comma); column names are matched whatever their letter case. t_dat is a
date (YYYY-MM-DD) or an ISO date and time, whose date as written is the purchase day. Customers keep their
columns as context (HM_SCHEMA); age stays numeric. Article ids are normalized to H&M's 10-digit form with leading
zeros, however the source wrote them.

Why DuckDB: the full Kaggle size (31.8 M transactions, 3.1 GB of CSV) must import in minutes within a few
GiB on a 2-core machine. DuckDB reads CSV in parallel straight into columns, runs the grouping (hash
aggregates, the session window) out of core under a set memory limit, spilling to disk rather than
failing, and sorts out of core, so no step holds the whole file as Python objects. Polars' streaming
engine covers fewer of these operations out of core; plain pyarrow has no out-of-core group-by. The one
step DuckDB does not do well is building a list per basket (a list() aggregate cannot spill): the outfits'
article lists are cut in pyarrow from DuckDB's sorted output, as offsets into one column of article ids.
The full-size timings: reports/benchmarks/hm_full_size.json.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contextual_bert.config import ImportHMConfig, IngestConfig, ModelConfig
from contextual_bert.data.contract import (
    DATE_COLUMN,
    DATE_TYPE,
    HM_SCHEMA,
    IMPORT_QUARANTINE,
    DataSchema,
    write_import_quarantine,
)
from contextual_bert.data.sources.hm_files import (
    ARTICLE_COLUMNS,
    ARTICLES,
    CUSTOMER_COLUMNS,
    CUSTOMERS,
    EXTRA_ARTICLE_COLUMNS,
    TRANSACTION_COLUMNS,
    TRANSACTIONS,
    _Db,
    _ident,
    _quote,
    _source_files,
    _SourceFile,
)
from contextual_bert.data.sources.hm_quarantine import REJECTED, UNUSABLE, _date_reason, _lines, _quarantine  # noqa: F401
from contextual_bert.errors import DataError

MAPPING_NOTE = (
    "H&M has no brand or style: brand <- section_name, style <- graphical_appearance_name; "
    "price <- mean transaction price (H&M's scaled units)"
)
DROP_REASONS = ("too_small", "too_large")
# The day of a purchase: t_dat as YYYY-MM-DD, or an ISO 8601 date and time, of which the date as written is the day
# (no time zone is converted: the day the shop recorded), or in import_hm.date_format. Anything else is not a date.
ISO_DAY = r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}(:?\d{2})?)?)?"
ISO_DAY_SQL = (
    f"CASE WHEN regexp_full_match(trim(t_dat), '{ISO_DAY}') "
    "THEN CAST(try_strptime(left(trim(t_dat), 10), '%Y-%m-%d') AS DATE) END"
)

# The first day of the basket a purchase belongs to, as SQL over `day_items` joined with `customer_days`.
BASKET_START = {"day": "day", "week": "CAST(date_trunc('week', day) AS DATE)", "session": "session"}
OUTFIT_ID_MARK = {"day": "", "week": "w", "session": "s"}  # outfit_id = <customer>_<mark><first day>


def _day_sql(date_format: str | None) -> str:
    """SQL of a purchase's day from t_dat: ISO, else (when set) import_hm.date_format."""
    if date_format is None:
        return ISO_DAY_SQL
    return f"coalesce({ISO_DAY_SQL}, CAST(try_strptime(trim(t_dat), {_quote(date_format)}) AS DATE))"


def _article_id_sql(column: str) -> str:
    """SQL: an article id as H&M's 10-digit text ('108775015', '108775015.0' -> '0108775015'); text that is
    not a whole number is kept as written (stripped) and will match nothing; empty -> NULL."""
    text = f"trim(CAST({column} AS VARCHAR))"
    whole = f"regexp_replace({text}, '\\.0*$', '')"
    return (f"CASE WHEN regexp_full_match({text}, '\\d+(\\.0*)?') "
            f"THEN (CASE WHEN length({whole}) < 10 THEN lpad({whole}, 10, '0') ELSE {whole} END) "
            f"ELSE nullif({text}, '') END")  # fmt: skip


def _transactions(db: _Db, file: _SourceFile, date_format: str | None) -> dict:
    """Table `tx` (cid, day, aid, price) of the readable transactions, customers and articles as integer
    codes (`customer_codes`: cid -> customer_id, `article_codes`: aid -> article_id; both codes follow the
    order of the ids' text, so ordering by a code orders by its id).

    Two reads of the file and no text function on its rows: the first collects the distinct raw customer
    ids, dates and article ids (a few million values at most), each parsed once into a dictionary; the
    second maps every row through the dictionaries by hash joins. Parsing and trimming 31.8 M rows of text
    and joining them on 64-character customer ids cost several times that. A row whose customer, date or
    article does not parse finds no dictionary entry: it is malformed (transactions = used + malformed), and
    only then a third read (`tx_malformed`) finds such rows for the quarantine."""
    read, path = file.read(), file.path
    if date_format is not None:  # a format DuckDB cannot read fails on any text: say so before reading the file
        try:
            db.con.execute(f"SELECT try_strptime('', {_quote(date_format)})")
        except db.duckdb.Error as exc:
            raise DataError(
                f"import_hm.date_format '{date_format}' is not a strptime format ({str(exc).strip().splitlines()[0]})"
            ) from None
    db.run(f"""CREATE TABLE tx_values AS
        SELECT GROUPING(customer_id, t_dat, article_id) AS grouping_id, customer_id, t_dat, article_id,
               count(*) AS n_rows
        FROM {read} GROUP BY GROUPING SETS ((customer_id), (t_dat), (article_id), ())""", path)  # fmt: skip
    (total,) = db.one("SELECT n_rows FROM tx_values WHERE grouping_id = 7")  # the () set: every row
    db.run("""CREATE TABLE customer_raw AS SELECT raw, customer_id, dense_rank() OVER (ORDER BY customer_id) AS cid
        FROM (SELECT customer_id AS raw, nullif(trim(customer_id), '') AS customer_id FROM tx_values
              WHERE grouping_id = 3) WHERE customer_id IS NOT NULL""")  # fmt: skip
    db.run(f"""CREATE TABLE day_raw AS SELECT raw, day FROM (
        SELECT t_dat AS raw, {_day_sql(date_format)} AS day FROM tx_values
        WHERE grouping_id = 5) WHERE day IS NOT NULL""")
    db.run(f"""CREATE TABLE article_raw AS SELECT raw, article_id, dense_rank() OVER (ORDER BY article_id) AS aid
        FROM (SELECT article_id AS raw, {_article_id_sql('article_id')} AS article_id FROM tx_values
              WHERE grouping_id = 6) WHERE article_id IS NOT NULL""")  # fmt: skip
    db.run("DROP TABLE tx_values")
    db.run("CREATE TABLE customer_codes AS SELECT DISTINCT cid, customer_id FROM customer_raw")
    db.run("CREATE TABLE article_codes AS SELECT DISTINCT aid, article_id FROM article_raw")
    with db.joins_as_written():
        db.run(f"""CREATE TABLE tx AS
            SELECT c.cid, d.day, a.aid, {file.number(file.optional('price', 't.price'))} AS price FROM {read} t
            JOIN customer_raw c ON t.customer_id = c.raw JOIN day_raw d ON t.t_dat = d.raw
            JOIN article_raw a ON t.article_id = a.raw""", path)  # fmt: skip
        (used,) = db.one("SELECT count(*) FROM tx")
        if used < total:  # row_number() OVER () follows the file: DuckDB keeps a scan's order
            db.run(f"""CREATE TABLE tx_malformed AS SELECT * FROM (
                SELECT t.source_row, CASE WHEN c.raw IS NULL THEN 'customer_id' WHEN d.raw IS NULL THEN 't_dat'
                                          ELSE 'article_id' END AS "column", {file.row_text('t')} AS text
                FROM (SELECT *, row_number() OVER () AS source_row FROM {read}) t
                LEFT JOIN customer_raw c ON t.customer_id = c.raw LEFT JOIN day_raw d ON t.t_dat = d.raw
                LEFT JOIN article_raw a ON t.article_id = a.raw
                WHERE c.raw IS NULL OR d.raw IS NULL OR a.raw IS NULL)""", path)  # fmt: skip
    db.run("DROP TABLE customer_raw; DROP TABLE day_raw; DROP TABLE article_raw")
    return {"transactions": int(total), "transactions_malformed_dropped": int(total - used)}


def _customers(db: _Db, file: _SourceFile | None) -> dict:
    """Table `customers` in the contract's columns, one row per id (the first one written); without a customers
    file, no rows and no context column (hm_schema)."""
    if file is None:
        db.run("CREATE TABLE customers (customer_id VARCHAR, source_row BIGINT)")
        return {"customers_rows": 0, "customers_without_id_dropped": 0, "customers_duplicate_dropped": 0}
    flag = "regexp_replace(trim(src.{0}), '^(\\d+)[.,]0+$', '\\1')"  # 1.0 or 1,0 -> 1
    columns = {
        "customer_id": "trim(src.customer_id)",
        "age": file.number(file.optional("age")),
        "club_member_status": file.optional("club_member_status"),
        "fashion_news_frequency": file.optional("fashion_news_frequency"),
        "FN": file.optional("FN", flag.format("FN")),
        "Active": file.optional("Active", flag.format("Active")),
        "postal_code": file.optional("postal_code"),
    }
    select = ", ".join(f"{sql} AS {_ident(name)}" for name, sql in columns.items())
    db.run(f"""CREATE TABLE customers_in AS
        SELECT {select}, row_number() OVER () AS source_row,
               CASE WHEN nullif(trim(src.customer_id), '') IS NULL THEN {file.row_text('src')} END AS text
        FROM {file.read()} src""", file.path)  # fmt: skip
    db.run("""CREATE TABLE customers AS SELECT * EXCLUDE (rank, text) FROM (
        SELECT *, row_number() OVER (PARTITION BY customer_id ORDER BY source_row) AS rank FROM customers_in
        WHERE nullif(customer_id, '') IS NOT NULL) WHERE rank = 1""")
    rows, without_id = db.one(
        "SELECT count(*), count(*) FILTER (WHERE nullif(customer_id, '') IS NULL) FROM customers_in"
    )
    (kept,) = db.one("SELECT count(*) FROM customers")
    return {
        "customers_rows": int(rows),
        "customers_without_id_dropped": int(without_id),
        "customers_duplicate_dropped": int(rows - without_id - kept),
    }


def _articles(db: _Db, file: _SourceFile) -> dict:
    """Table `articles` in the contract's columns, priced by the mean transaction price."""
    columns = {"article_id": _article_id_sql("src.article_id")}
    columns |= {ours: file.optional(theirs, f"trim(src.{_ident(theirs)})") for ours, theirs in ARTICLE_COLUMNS.items()}
    columns |= {extra: file.optional(extra) for extra in EXTRA_ARTICLE_COLUMNS}
    select = ", ".join(f"{sql} AS {_ident(name)}" for name, sql in columns.items())
    db.run(f"""CREATE TABLE articles_in AS SELECT {select}, row_number() OVER () AS source_row,
        CASE WHEN {columns['article_id']} IS NULL THEN {file.row_text('src')} END AS text
        FROM {file.read()} src""", file.path)  # fmt: skip
    db.run("""CREATE TABLE articles_unique AS SELECT * EXCLUDE (rank, text) FROM (
        SELECT *, row_number() OVER (PARTITION BY article_id ORDER BY source_row) AS rank FROM articles_in
        WHERE article_id IS NOT NULL) WHERE rank = 1""")
    # The mean in exact decimals: a parallel sum of doubles adds in a varying order, and at the full size 48% of
    # the means differed in their last bits between two imports (a new file hash for DVC each time). A price
    # is > 0 (a return's negative amount is not one) and within 1e15, so that 1e11 of them fit DECIMAL(38, 12).
    # An article never sold (or only at unreadable prices) is kept with its price missing: it is in the
    # catalogue, where a model with attributes can rank it.
    db.run("""CREATE TABLE articles AS
        SELECT a.* EXCLUDE (source_row), p.price, a.source_row FROM articles_unique a
        LEFT JOIN (SELECT c.article_id, p.price FROM article_codes c JOIN (
                  SELECT aid, CAST(avg(CAST(price AS DECIMAL(38, 12))) AS DOUBLE) AS price FROM tx
                  WHERE isfinite(price) AND price > 0 AND price < 1e15 GROUP BY aid) p USING (aid)) p
        USING (article_id)""")
    rows, without_id = db.one("SELECT count(*), count(*) FILTER (WHERE article_id IS NULL) FROM articles_in")
    (in_source,) = db.one("SELECT count(*) FROM articles_unique")
    (without_price,) = db.one("SELECT count(*) FILTER (WHERE price IS NULL) FROM articles")
    return {
        "articles_rows": int(rows),
        "articles_without_id_dropped": int(without_id),
        "articles_in_source": int(in_source),
        "articles_without_price": int(without_price),
    }


def _baskets(db: _Db, cfg: ImportHMConfig, min_items: int, max_items: int) -> dict:
    """Tables `day_items` (cid, day, aid: each distinct purchase), `customer_days` (cid, day, its number of
    distinct articles n, the first day of its session) and, per basket definition, `baskets_<definition>`
    (cid, first_day, n); returns the outfits each definition gives.

    A week's or a session's distinct articles are counted only where the count decides whether the basket
    is kept: a basket of one day has that day's n; one whose days hold fewer than min_items purchases in
    all is too small, one with a day above max_items too large, whatever the overlap. Only the remaining
    multi-day baskets (a small share) are counted article by article. There n is exact where the basket is
    kept and a bound on the right side of the limit otherwise."""
    db.run("CREATE TABLE day_items AS SELECT DISTINCT cid, day, aid FROM tx")
    db.run("DROP TABLE tx")  # read by _articles (prices) before
    db.run(f"""CREATE TABLE customer_days AS
        SELECT cid, day, n,
               max(CASE WHEN previous IS NULL OR day - previous > {cfg.session_gap_days} THEN day END)
                   OVER (PARTITION BY cid ORDER BY day ROWS UNBOUNDED PRECEDING) AS session
        FROM (SELECT cid, day, n, lag(day) OVER (PARTITION BY cid ORDER BY day) AS previous
              FROM (SELECT cid, day, count(*) AS n FROM day_items GROUP BY cid, day))""")  # fmt: skip
    low, high = min_items, max_items
    counts = {}
    for definition, start in BASKET_START.items():
        table = f"baskets_{definition}"
        if definition == "day":  # one day, one basket: n is exact
            db.run(f"CREATE TABLE {table} AS SELECT cid, day AS first_day, n FROM customer_days")
        else:
            db.run(f"""CREATE TABLE {table} AS
                WITH days AS (SELECT cid, day, {start} AS first_day, n FROM customer_days),
                bounds AS (SELECT cid, first_day, count(*) AS days, sum(n) AS total, max(n) AS largest
                           FROM days GROUP BY cid, first_day),
                open AS (SELECT cid, first_day FROM bounds
                         WHERE days > 1 AND total >= {low} AND largest <= {high}),
                exact AS (SELECT d.cid, d.first_day, count(DISTINCT i.aid) AS n
                          FROM day_items i JOIN days d USING (cid, day) JOIN open o USING (cid, first_day)
                          GROUP BY d.cid, d.first_day)
                SELECT b.cid, b.first_day, CASE WHEN b.days = 1 OR b.total < {low} THEN b.total
                                                WHEN b.largest > {high} THEN b.largest ELSE e.n END AS n
                FROM bounds b LEFT JOIN exact e USING (cid, first_day)""")  # fmt: skip
        label = f"session_gap_{cfg.session_gap_days}d" if definition == "session" else definition
        counts[label] = int(db.one(f"SELECT count(*) FROM {table} WHERE n BETWEEN {low} AND {high}")[0])
    return counts


def _outfits(db: _Db, cfg: ImportHMConfig, min_items: int, max_items: int) -> tuple:
    """The outfits in the contract's columns (a pyarrow table) and their counts, for the chosen basket
    definition. Article lists are built only for the kept baskets."""
    low, high = min_items, max_items
    baskets, too_small, too_large = db.one(f"""SELECT count(*), count(*) FILTER (WHERE n < {low}),
        count(*) FILTER (WHERE n > {high}) FROM baskets_{cfg.basket}""")
    # a day's purchases are distinct already; a week or a session may hold an article on two days
    distinct = "" if cfg.basket == "day" else "DISTINCT"
    db.run(f"""CREATE TABLE outfit_items AS SELECT {distinct} d.cid, d.first_day, i.aid
        FROM day_items i JOIN (SELECT cid, day, {BASKET_START[cfg.basket]} AS first_day FROM customer_days) d
             USING (cid, day)
        JOIN (SELECT cid, first_day FROM baskets_{cfg.basket} WHERE n BETWEEN {low} AND {high}) k
             USING (cid, first_day)""")  # fmt: skip
    db.run(f"DROP TABLE day_items; {'; '.join(f'DROP TABLE baskets_{d}' for d in BASKET_START)}")
    db.run("""CREATE TABLE article_rows AS SELECT c.aid, c.article_id, a.article_id IS NOT NULL AS has_row
        FROM article_codes c LEFT JOIN (SELECT article_id FROM articles) a ON c.article_id = a.article_id""")
    db.run("""CREATE TABLE customer_rows AS SELECT c.cid, c.customer_id, k.customer_id IS NOT NULL AS has_row
        FROM customer_codes c LEFT JOIN (SELECT customer_id FROM customers) k ON c.customer_id = k.customer_id""")
    # No list() aggregate: its states hold every basket's strings at once and cannot spill (2.7 M baskets ran
    # out of 3 GiB). DuckDB sorts the kept purchases (out of core), and the lists are cut from the sorted
    # column by offsets. An aid code sorts like its article id, so each list comes out sorted.
    items = db.arrow("""SELECT i.cid, i.first_day, a.article_id, a.has_row FROM outfit_items i
        JOIN article_rows a USING (aid) ORDER BY i.cid, i.first_day, i.aid""")
    db.run("DROP TABLE outfit_items")
    customers = db.arrow("SELECT cid, customer_id, has_row FROM customer_rows ORDER BY cid")
    outfits, no_customer, no_article_row, articles_without_row = _outfit_lists(items, customers, cfg.basket)
    kept = outfits.num_rows
    if kept + too_small + too_large != baskets:
        raise RuntimeError("baskets lost between kept and dropped")  # cannot happen
    return outfits, {
        "baskets": int(baskets),
        "baskets_kept": int(kept),
        "baskets_dropped": {"too_small": int(too_small), "too_large": int(too_large)},
        "outfits_without_customer_row": int(no_customer),
        "outfits_with_articles_without_row": int(no_article_row),
        "articles_without_row": int(articles_without_row),
    }


def _outfit_lists(items, customers, basket: str):
    """The outfits table (outfit_id, customer_id, article_ids, date) from the kept purchases `items` (cid,
    first_day, article_id, has_row), sorted by basket then article, and `customers` (cid, customer_id,
    has_row) sorted by cid = 1..n; with the outfits lacking a customer row, lacking an article row, and the
    distinct articles without a row."""
    items = items.combine_chunks()
    cid = items["cid"].to_numpy().astype(np.int64)
    day = items["first_day"].cast(pa.int32()).to_numpy()
    new_basket = np.r_[True, (cid[1:] != cid[:-1]) | (day[1:] != day[:-1])] if len(cid) else np.zeros(0, bool)
    starts = np.flatnonzero(new_basket)
    offsets = pa.array(np.r_[starts, len(cid)].astype(np.int32))
    article_ids = pa.ListArray.from_arrays(offsets, items["article_id"].combine_chunks())
    lacks_article = ~np.asarray(items["has_row"].to_numpy(zero_copy_only=False), dtype=bool)
    outfit_lacks_article = np.logical_or.reduceat(lacks_article, starts) if len(starts) else lacks_article
    articles_without_row = pc.count_distinct(pc.filter(items["article_id"], pa.array(lacks_article))).as_py()

    codes = customers["cid"].to_numpy()
    if not np.array_equal(codes, np.arange(1, len(codes) + 1)):
        raise RuntimeError("customer codes are not 1..n")  # dense_rank gives exactly these
    rows = pa.array(cid[starts] - 1)
    customer_id = customers["customer_id"].combine_chunks().take(rows)
    lacks_customer = ~np.asarray(customers["has_row"].to_numpy(zero_copy_only=False), dtype=bool)[cid[starts] - 1]
    first_day = items["first_day"].take(pa.array(starts)).cast(DATE_TYPE)  # the basket's (first) day: its date
    day_text = pc.strftime(first_day.cast(pa.timestamp("s")), format="%Y-%m-%d")
    outfit_id = pc.binary_join_element_wise(customer_id, day_text, "_" + OUTFIT_ID_MARK[basket])
    table = pa.table({"outfit_id": outfit_id, "customer_id": customer_id, "article_ids": article_ids,
                      DATE_COLUMN: first_day})  # fmt: skip
    schema = pa.schema([pa.field(f.name, f.type, nullable=False) for f in table.schema])  # as DuckDB wrote it
    return table.cast(schema), int(lacks_customer.sum()), int(outfit_lacks_article.sum()), int(articles_without_row)


class _Clock:
    """clock(phase, result) -> result, noting the wall seconds since the previous call under `phase`."""

    def __init__(self, timings: dict | None):
        self.timings, self.last = timings, time.perf_counter()

    def __call__(self, phase: str, result):
        now = time.perf_counter()
        if self.timings is not None:
            self.timings[phase] = round(now - self.last, 2)
        self.last = now
        return result


def import_hm(
    source: Path,
    out_dir: Path,
    cfg: ImportHMConfig,
    timings: dict | None = None,
    max_set_size: int = ModelConfig().max_set_size,
    min_set_size: int = IngestConfig().min_set_size,
) -> dict:
    """Read transactions_train.csv, customers.csv and articles.csv from `source`; write the raw contract
    (articles/customers/outfits.parquet, schema.json = HM_SCHEMA, ingest_report.json) into `out_dir`.
    `timings`, when given, receives the wall seconds of each phase (for benchmarks; not in the report, which
    stays the same for the same input)."""
    source, out_dir = Path(source), Path(out_dir)
    files = _source_files(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".import-hm-", dir=out_dir) as scratch:
        db = _Db(Path(scratch), cfg)
        clock = _Clock(timings)
        try:
            counts = clock("transactions", _transactions(db, files[TRANSACTIONS], cfg.date_format))
            counts |= clock("customers", _customers(db, files.get(CUSTOMERS)))
            counts |= clock("articles", _articles(db, files[ARTICLES]))
            quarantine, lines_rejected = _quarantine(db, files, counts, cfg.date_format)
            quarantined = write_import_quarantine(quarantine, out_dir)
            counts |= {
                "lines_rejected": lines_rejected,
                "quarantined": {"file": IMPORT_QUARANTINE, "rows": quarantined},
            }
            clock("quarantine", None)
            by_definition = clock("basket_definitions", _baskets(db, cfg, min_set_size, max_set_size))
            outfits, outfit_counts = clock("outfits", _outfits(db, cfg, min_set_size, max_set_size))
            counts |= outfit_counts
            for table in ("articles", "customers"):
                db.run(
                    f"COPY (SELECT * EXCLUDE (source_row) FROM {table} ORDER BY source_row) "
                    f"TO {_quote(out_dir / f'{table}.parquet')} (FORMAT parquet)"
                )
            pq.write_table(outfits, out_dir / "outfits.parquet")  # ordered by customer code, then date
            rows = {t: int(db.one(f"SELECT count(*) FROM {t}")[0]) for t in ("articles", "customers")}
            rows["outfits"] = outfits.num_rows
            clock("write_parquet", None)
        finally:
            db.con.close()
    hm_schema(CUSTOMERS in files).save(out_dir)
    missing_columns = {
        TRANSACTIONS: [c for c in TRANSACTION_COLUMNS if c not in files[TRANSACTIONS].columns],
        ARTICLES: [c for c in (*ARTICLE_COLUMNS.values(), *EXTRA_ARTICLE_COLUMNS) if c not in files[ARTICLES].columns],
    }
    if CUSTOMERS in files:
        missing_columns[CUSTOMERS] = [c for c in CUSTOMER_COLUMNS if c not in files[CUSTOMERS].columns]
    report = {
        "source": "hm",
        "source_dir": str(source),
        "files": {name: file.path.name for name, file in files.items()},  # as stored: CSV, gzipped or Parquet
        "basket": {"by": cfg.basket, **({"session_gap_days": cfg.session_gap_days} if cfg.basket == "session" else {})},
        **counts,
        "outfits_by_basket_definition": by_definition,
        "min_items": min_set_size,
        "max_items": max_set_size,
        "columns_missing": {k: v for k, v in missing_columns.items() if v},
        "rows": rows,
        "mapping": MAPPING_NOTE,
    }
    (out_dir / "ingest_report.json").write_text(json.dumps(report, indent=2))
    if not rows["outfits"]:  # the report stays for a look at why; an empty import is no result
        dropped = counts["baskets_dropped"]
        raise DataError(f"no outfit kept: of {counts['baskets']} baskets (import_hm.basket: {cfg.basket}) none has "
                        f"{min_set_size}-{max_set_size} distinct articles ({dropped['too_small']} too small, "
                        f"{dropped['too_large']} too large)", path=source)  # fmt: skip
    return report


def ingest(cfg, source: Path | None = None) -> dict:
    """The `hm` entry of sources.SOURCES."""
    return import_hm(
        source or cfg.import_hm.source,
        out_dir=cfg.paths.raw_dir,
        cfg=cfg.import_hm,
        max_set_size=cfg.model.max_set_size,
        min_set_size=cfg.ingest.min_set_size,
    )


def hm_schema(has_customers: bool) -> DataSchema:
    """The customers' columns as context (HM_SCHEMA); without a customers file, no context."""
    return HM_SCHEMA if has_customers else DataSchema(source=HM_SCHEMA.source, context_columns=())


def schema(cfg) -> DataSchema:
    """The context columns of the `hm` source (sources.SOURCES)."""
    return hm_schema(CUSTOMERS in _source_files(Path(cfg.import_hm.source)))


def inputs(cfg) -> list[Path]:
    """The files the `hm` source reads (sources.SOURCES), as stored (.csv, .csv.gz or .parquet)."""
    return [file.path for file in _source_files(Path(cfg.import_hm.source)).values()]
