"""The H&M import at the full Kaggle size: generate H&M-shaped files, then import-hm, validate, features.

The Kaggle files themselves are not in the project (nor may they be): this script writes files of the same
shape and size (31,788,324 transactions over 734 days, 1,371,980 customers, 105,542 articles, every column
of the three files; about 3.3 GB of CSV) into a scratch folder outside git (default /tmp/hm_full_size),
and reuses them when they are already there. Baskets: a customer's purchases on one day, sizes 1 + a
geometric draw (mean 3.3 rows, duplicates of an article included), customers by a log-normal activity,
articles by a Zipf popularity: like the real file, most baskets are small and a few hundred thousand hold
4-8 distinct articles.

The last step, import_hm_malformed, imports the same files with every 100,000th transaction line spoiled
(317 lines cut to three fields, 318 dates that do not parse; a copy under scratch/malformed): what the
quarantine costs at this size, and a check that it names the right lines. import_hm_semicolon imports the
same files as a spreadsheet in a decimal-comma locale exports them (a copy under scratch/semicolon): fields
separated by ';', prices, ages and flags with a decimal comma, t_dat as a date and time: what that path
costs, and a check that it writes the same tables. import_hm_parquet imports the same files converted to
Parquet with the types a reader infers (integer article ids, a date t_dat, double prices; a copy under
scratch/parquet, written by DuckDB), as users store the Kaggle data, with the same check.

Each step runs in a process of its own, so its peak resident memory (DuckDB included: it runs in-process)
is its own. Writes reports/benchmarks/hm_full_size.json: wall and CPU seconds, peak RSS, row counts per
step, the targets (import <= 180 s and <= 6 GiB peak on this 2-core machine) and the load average around
each step (other work on the machine slows the numbers).

    nice -n 10 .venv/bin/python benchmarks/hm_full_size.py [--scratch /tmp/hm_full_size] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
N_TRANSACTIONS, N_CUSTOMERS, N_ARTICLES, N_DAYS = 31_788_324, 1_371_980, 105_542, 734
FIRST_DAY = "2018-09-20"
IMPORTS = {"import_hm": None, "import_hm_malformed": "malformed", "import_hm_semicolon": "semicolon",
           "import_hm_parquet": "parquet"}  # step -> copy  # fmt: skip
SAME_TABLES = ("import_hm_semicolon", "import_hm_parquet")  # steps that must write exactly what import_hm wrote
TARGETS = {step: {"wall_s": 180.0, "peak_rss_mib": 6 * 1024.0} for step in IMPORTS}
TARGETS["features_history"] = {"wall_s": 180.0, "peak_rss_mib": 8 * 1024.0}  # issue 58: within 3 minutes and 8 GiB
STEPS = (
    "import_hm",
    "validate",
    "features",
    "features_history",
    "import_hm_malformed",
    "import_hm_semicolon",
    "import_hm_parquet",
)
MALFORMED_EVERY = 100_000  # import_hm_malformed: every 100,000th line of the transactions is spoiled
ARTICLE_HEADER = (
    "article_id,product_code,prod_name,product_type_no,product_type_name,product_group_name,"
    "graphical_appearance_no,graphical_appearance_name,colour_group_code,colour_group_name,"
    "perceived_colour_value_id,perceived_colour_value_name,perceived_colour_master_id,"
    "perceived_colour_master_name,department_no,department_name,index_code,index_name,index_group_no,"
    "index_group_name,section_no,section_name,garment_group_no,garment_group_name,detail_desc"
).split(",")


def _hex_ids(rng, n: int):
    """n distinct 64-character hex strings (H&M's hashed customer ids and postal codes) as a pyarrow array."""
    import numpy as np
    import pyarrow as pa

    raw = rng.integers(0, 256, size=(n, 32), dtype=np.uint8)
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    text = np.stack([digits[raw >> 4], digits[raw & 15]], axis=2).reshape(n, 64)
    offsets = np.arange(0, 64 * n + 1, 64, dtype=np.int64)
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text.tobytes())).cast(pa.string())


def _write_csv(table, path: Path, append: bool = False) -> None:
    import pyarrow.csv as pcsv

    with open(path, "ab" if append else "wb") as f:
        if not append:  # Kaggle's header is not quoted; pyarrow would quote it
            f.write((",".join(table.column_names) + "\n").encode())
        pcsv.write_csv(table, f, pcsv.WriteOptions(include_header=False, quoting_style="none"))


def generate(scratch: Path, seed: int = 0) -> dict:
    """Write transactions_train.csv, customers.csv and articles.csv of the full Kaggle size to `scratch`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = np.random.default_rng(seed)
    scratch.mkdir(parents=True, exist_ok=True)

    customer_ids = _hex_ids(rng, N_CUSTOMERS)
    postal = _hex_ids(rng, 352_899)
    choice = lambda values, p, n: pa.array(np.asarray(values, dtype=object)[rng.choice(len(values), n, p=p)])  # noqa: E731
    age = rng.integers(16, 99, N_CUSTOMERS).astype(float)
    customers = pa.table({
        "customer_id": customer_ids,
        "FN": choice(["1.0", None], [0.35, 0.65], N_CUSTOMERS),
        "Active": choice(["1.0", None], [0.34, 0.66], N_CUSTOMERS),
        "club_member_status": choice(["ACTIVE", "PRE-CREATE", "LEFT CLUB", None], [0.927, 0.067, 0.001, 0.005],
                                     N_CUSTOMERS),
        "fashion_news_frequency": choice(["NONE", "Regularly", "Monthly", None], [0.63, 0.355, 0.003, 0.012],
                                         N_CUSTOMERS),
        "age": pa.array(np.where(rng.random(N_CUSTOMERS) < 0.012, np.nan, age), from_pandas=True),
        "postal_code": pc.take(postal, pa.array(rng.integers(0, len(postal), N_CUSTOMERS))),
    })  # fmt: skip
    _write_csv(customers, scratch / "customers.csv")

    codes = np.sort(rng.choice(np.arange(108_775, 959_462), 47_224, replace=False))
    variants = rng.integers(1, 5, len(codes))
    product_code = np.repeat(codes, variants)[:N_ARTICLES]
    product_code = np.concatenate([product_code, rng.choice(codes, N_ARTICLES - len(product_code))])
    product_code.sort()
    variant_no = np.arange(N_ARTICLES) - np.searchsorted(product_code, product_code) + 1
    article_id = product_code * 1000 + variant_no
    if len(np.unique(article_id)) != N_ARTICLES:
        raise RuntimeError("article ids are not unique")  # cannot happen: (code, variant) pairs are distinct

    def vocab(prefix: str, n: int):
        return pc.take(pa.array([f"{prefix} {i}" for i in range(n)]), pa.array(rng.integers(0, n, N_ARTICLES)))

    def numbers(low: int, n: int):
        return pa.array(rng.integers(low, low + n, N_ARTICLES))

    article_columns = {
        "article_id": pa.array(article_id), "product_code": pa.array(product_code),
        "prod_name": vocab("Product", 45_875), "product_type_no": numbers(49, 131),
        "product_type_name": vocab("Type", 131), "product_group_name": vocab("Group", 19),
        "graphical_appearance_no": numbers(1010001, 30), "graphical_appearance_name": vocab("Appearance", 30),
        "colour_group_code": numbers(1, 50), "colour_group_name": vocab("Colour", 50),
        "perceived_colour_value_id": numbers(1, 8), "perceived_colour_value_name": vocab("Value", 8),
        "perceived_colour_master_id": numbers(1, 20), "perceived_colour_master_name": vocab("Master", 20),
        "department_no": numbers(1201, 299), "department_name": vocab("Department", 250),
        "index_code": vocab("Index", 10), "index_name": vocab("Index name", 10),
        "index_group_no": numbers(1, 5), "index_group_name": vocab("Index group", 5),
        "section_no": numbers(2, 57), "section_name": vocab("Section", 56),
        "garment_group_no": numbers(1001, 21), "garment_group_name": vocab("Garment group", 21),
        "detail_desc": vocab("A generated description of a garment in a few words of text number", 43_404),
    }  # fmt: skip
    _write_csv(pa.table({name: article_columns[name] for name in ARTICLE_HEADER}), scratch / "articles.csv")

    # Baskets: sizes 1 + geometric, a customer by activity and a day each; rows sorted by day like Kaggle's.
    sizes = 1 + rng.geometric(1 / 3.3, size=int(N_TRANSACTIONS / 3.0)) - 1
    sizes = sizes[: np.searchsorted(np.cumsum(sizes), N_TRANSACTIONS) + 1]
    sizes[-1] -= int(sizes.sum() - N_TRANSACTIONS)
    n_baskets = len(sizes)
    activity = np.cumsum(rng.lognormal(0.0, 1.2, N_CUSTOMERS))
    basket_customer = np.searchsorted(activity, rng.random(n_baskets) * activity[-1]).astype(np.int32)
    basket_day = rng.integers(0, N_DAYS, n_baskets).astype(np.int16)
    order = np.argsort(basket_day, kind="stable")
    sizes, basket_customer, basket_day = sizes[order], basket_customer[order], basket_day[order]
    popularity = np.cumsum(1.0 / np.arange(1, N_ARTICLES + 1) ** 0.9)
    article_rank = rng.permutation(N_ARTICLES)  # which article is how popular
    base_price = rng.lognormal(np.log(0.025), 0.5, N_ARTICLES)
    days = pa.array([str(d) for d in np.datetime64(FIRST_DAY) + np.arange(N_DAYS)])
    article_text = pa.array([str(a) for a in article_id])  # H&M's transactions drop the leading zero

    path = scratch / "transactions_train.csv"
    starts = np.concatenate([[0], np.cumsum(sizes)])
    chunk = 2_000_000  # baskets per written chunk
    for first in range(0, n_baskets, chunk):
        last = min(first + chunk, n_baskets)
        rows = int(starts[last] - starts[first])
        basket = np.repeat(np.arange(first, last), sizes[first:last])
        articles = article_rank[np.minimum(np.searchsorted(popularity, rng.random(rows) * popularity[-1]),
                                           N_ARTICLES - 1)]  # fmt: skip
        price = np.round(base_price[articles] * rng.choice([1.0, 1.0, 0.8, 0.6], rows), 16)
        table = pa.table({
            "t_dat": pc.take(days, pa.array(basket_day[basket])),
            "customer_id": pc.take(customer_ids, pa.array(basket_customer[basket])),
            "article_id": pc.take(article_text, pa.array(articles)),
            "price": pa.array(price),
            "sales_channel_id": pa.array(rng.choice(np.array([1, 2], dtype=np.int8), rows, p=[0.3, 0.7])),
        })  # fmt: skip
        _write_csv(table, path, append=first > 0)
    files = {p.name: p.stat().st_size for p in sorted(scratch.glob("*.csv"))}
    return {"rows": {"transactions": N_TRANSACTIONS, "customers": N_CUSTOMERS, "articles": N_ARTICLES,
                     "baskets_written": n_baskets}, "bytes": files}  # fmt: skip


def malformed_copy(scratch: Path) -> Path:
    """scratch/malformed: the generated files, the transactions with every MALFORMED_EVERY-th line cut to three
    fields (not readable as CSV) and, halfway between, a date that does not parse (readable, not usable)."""
    folder = scratch / "malformed"
    if (folder / "transactions_train.csv").exists():
        return folder
    folder.mkdir(exist_ok=True)
    for name in ("customers.csv", "articles.csv"):
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(scratch / name)
    half = MALFORMED_EVERY // 2
    with open(scratch / "transactions_train.csv") as src, open(folder / "partial.csv", "w") as out:
        for number, line in enumerate(src, 1):
            if number > 1 and number % MALFORMED_EVERY == 0:
                line = ",".join(line.split(",")[:3]) + "\n"
            elif number > 1 and number % MALFORMED_EVERY == half:
                line = "bad-date" + line[line.index(",") :]
            out.write(line)
    (folder / "partial.csv").rename(folder / "transactions_train.csv")
    return folder


def semicolon_copy(scratch: Path) -> Path:
    """scratch/semicolon: the generated files as a spreadsheet in a decimal-comma locale writes them: ';'
    between fields, a decimal comma in prices and ages, t_dat as a date and time ('2018-09-20 14:30:00')."""
    import csv

    folder = scratch / "semicolon"
    if (folder / "transactions_train.csv").exists():
        return folder
    folder.mkdir(exist_ok=True)
    for name, decimal in (("customers.csv", ("FN", "Active", "age")), ("articles.csv", ())):  # quoted fields: csv
        with open(scratch / name, newline="") as src, open(folder / name, "w", newline="") as out:
            reader, writer = csv.reader(src), csv.writer(out, delimiter=";", lineterminator="\n")
            header = next(reader)
            writer.writerow(header)
            at = [header.index(c) for c in decimal]
            for row in reader:
                for i in at:
                    row[i] = row[i].replace(".", ",")
                writer.writerow(row)
    with open(scratch / "transactions_train.csv") as src, open(folder / "partial.csv", "w") as out:
        out.write(src.readline().replace(",", ";"))
        for line in src:  # no quoted field: t_dat,customer_id,article_id,price,sales_channel_id
            day, customer, article, price, channel = line.split(",")
            out.write(f"{day} 14:30:00;{customer};{article};{price.replace('.', ',')};{channel}")
    (folder / "partial.csv").rename(folder / "transactions_train.csv")
    return folder


def parquet_copy(scratch: Path) -> Path:
    """scratch/parquet: the generated files as Parquet, typed as DuckDB's CSV reader infers them."""
    import duckdb

    folder = scratch / "parquet"
    folder.mkdir(exist_ok=True)
    for name in ("transactions_train", "customers", "articles"):
        if not (folder / f"{name}.parquet").exists():
            duckdb.sql(f"COPY (SELECT * FROM read_csv('{scratch / name}.csv')) TO '{folder / name}.partial' "
                       "(FORMAT parquet)")  # fmt: skip
            (folder / f"{name}.partial").rename(folder / f"{name}.parquet")
    return folder


def same_tables(work: Path, copy: str) -> dict:
    """Per table: whether the import of scratch/<copy> wrote exactly what import_hm wrote."""
    import pyarrow.parquet as pq

    def read(folder: str, table: str):
        return pq.read_table(work / folder / f"{table}.parquet")

    return {t: read(f"raw_{copy}", t).equals(read("raw", t)) for t in ("outfits", "articles", "customers")}


def run_step(step: str, scratch: Path) -> dict:
    """One step, in this process (called in a child): its result, wall/CPU seconds and peak RSS."""
    from contextual_bert.config import FeaturesConfig, ImportHMConfig, ModelConfig, ValidateConfig

    work = scratch / "pipeline"
    started, cpu_started = time.perf_counter(), time.process_time()
    if step in IMPORTS:
        from contextual_bert.data import import_hm

        phases: dict = {}
        copy = IMPORTS[step]
        report = import_hm(scratch / copy if copy else scratch, work / (f"raw_{copy}" if copy else "raw"),
                           ImportHMConfig(), timings=phases)  # fmt: skip
        rows = {k: report[k] for k in ("transactions", "transactions_malformed_dropped", "lines_rejected", "quarantined",
                                       "baskets", "baskets_kept", "baskets_dropped", "outfits_by_basket_definition",
                                       "outfits_without_customer_row", "rows")}  # fmt: skip
        rows["phase_wall_s"] = phases
    elif step == "validate":
        from contextual_bert.data import validate

        summary = validate(work / "raw", work / "validated", work / "quarantine", work / "reports",
                           ValidateConfig(max_quarantine_share=1.0))  # fmt: skip
        rows = {name: {k: t[k] for k in ("rows_in", "valid", "quarantined")} for name, t in summary["tables"].items()}
    else:  # features; features_history: the time split and every outfit's history (history.history_items)
        from contextual_bert.config import HistoryConfig
        from contextual_bert.data import build_features

        cfg = (
            FeaturesConfig(split="time", history=HistoryConfig(enabled=True))
            if step == "features_history"
            else FeaturesConfig()
        )
        manifest = build_features(work / "validated", work / step, cfg, max_set_size=ModelConfig().max_set_size)
        rows = manifest["rows"] | {"n_items": manifest["n_items"]}
        if step == "features_history":
            import pyarrow.parquet as pq

            history = pq.read_table(work / step / "outfits.parquet", columns=["history"]).column("history")
            lengths = history.combine_chunks().value_lengths().to_numpy(zero_copy_only=False)
            rows["history_slots"] = {
                "mean": round(float(lengths.mean()), 2),
                "with_history": int((lengths > 0).sum()),
                "max": int(lengths.max()),
            }
    return {
        "wall_s": round(time.perf_counter() - started, 2),
        "cpu_s": round(time.process_time() - cpu_started, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rows": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scratch",
        type=Path,
        default=Path("/tmp/hm_full_size"),
        help="where the generated files go (outside git; about 3.3 GB plus the pipeline's)",
    )
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    parser.add_argument("--keep", action="store_true", help="keep the generated files and outputs")
    parser.add_argument("--step", help=argparse.SUPPRESS)  # internal: run one step in this process
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "benchmarks" / "hm_full_size.json")
    parser.add_argument("--note", default="", help="what else ran on the machine, for the record")
    args = parser.parse_args()
    if args.step:
        print(json.dumps(run_step(args.step, args.scratch)))
        return 0

    marker = args.scratch / "generated.json"
    generated = json.loads(marker.read_text()) if marker.exists() else None
    if generated is None:
        started = time.perf_counter()
        generated = generate(args.scratch)
        generated["wall_s"] = round(time.perf_counter() - started, 1)
        marker.write_text(json.dumps(generated))
    results: dict = {"generate": generated}

    def write() -> None:  # after every step: what was measured survives a later step that fails or is stopped
        for step, target in TARGETS.items():
            if "wall_s" in results.get(step, {}):
                results[step]["meets_target"] = all(results[step][k] <= v for k, v in target.items())
        out = {
            "benchmark": "H&M import, validate and features at the full Kaggle size (generated files)",
            "targets": TARGETS,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "note": args.note,
            "results": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    for step in args.steps:
        if step == "import_hm_malformed":
            malformed_copy(args.scratch)  # written before the step's clock starts
        if step == "import_hm_semicolon":
            semicolon_copy(args.scratch)
        if step == "import_hm_parquet":
            parquet_copy(args.scratch)
        load_before = os.getloadavg()[0]
        child = subprocess.run([sys.executable, __file__, "--step", step, "--scratch", str(args.scratch)],
                               capture_output=True, text=True, env=env)  # fmt: skip
        if child.returncode != 0:
            lines = child.stderr.strip().splitlines() or ["?"]
            # the exception's own line (DuckDB adds advice lines after it)
            raised = [line for line in lines if line[:1].isalpha() and ("Error" in line or "Exception" in line)]
            results[step] = {"error": (raised or lines)[-1]}
            print(f"{step}: failed: {results[step]['error']}", file=sys.stderr)
            break
        results[step] = json.loads(child.stdout.strip().splitlines()[-1])
        results[step]["load_average_1min"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
        if step in SAME_TABLES and (args.scratch / "pipeline" / "raw").is_dir():
            results[step]["same_tables_as_import_hm"] = same_tables(args.scratch / "pipeline", IMPORTS[step])
        print(f"{step}: {results[step]['wall_s']} s, peak {results[step]['peak_rss_mib']} MiB", file=sys.stderr)
        write()
    write()
    if not args.keep:
        shutil.rmtree(args.scratch / "pipeline", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
