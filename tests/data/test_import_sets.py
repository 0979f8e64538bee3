"""import-sets: curated sets from pairs (CSV, Parquet, JSON lines) or the Polyvore Outfits JSON layout,
with or without customers; and the pipeline on them end to end ([None] and popularity only)."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import TINY_MODEL, dvc_project

from contextual_bert.cli import main
from contextual_bert.config import FeaturesConfig, ImportSetsConfig, ValidateConfig
from contextual_bert.data.contract import DATE_COLUMN, DATE_TYPE, IMPORT_QUARANTINE, DataSchema
from contextual_bert.data.feature_store import load_split
from contextual_bert.data.features import build_features
from contextual_bert.data.sources.sets import import_sets
from contextual_bert.data.validation import validate
from contextual_bert.errors import DataError


def polyvore_sets(n_sets: int = 300, n_items: int = 60, seed: int = 0) -> list[dict]:
    """Polyvore Outfits layout: sets of 2-10 items (some outside 4-8), an item listed twice now and then."""
    rng = np.random.default_rng(seed)
    sets = []
    for s in range(n_sets):
        ids = [str(100_000 + i) for i in rng.choice(n_items, rng.integers(2, 11), replace=False)]
        if s % 50 == 0:
            ids.append(ids[0])  # listed twice: counts once
        sets.append({"set_id": str(200_000 + s), "items": [{"item_id": i, "index": k + 1} for k, i in enumerate(ids)]})
    return sets


def write_polyvore(path: Path, **kwargs) -> tuple[Path, list[dict]]:
    sets = polyvore_sets(**kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sets))
    return path, sets


def write_pairs_csv(path: Path, sets: list[dict]) -> Path:
    rows = [(s["set_id"], item["item_id"]) for s in sets for item in s["items"]]
    pd.DataFrame(rows, columns=["outfit_id", "item_id"]).to_csv(path, index=False)
    return path


def test_polyvore_layout(tmp_path):
    source, sets = write_polyvore(tmp_path / "train.json")
    report = import_sets(source, tmp_path / "raw", ImportSetsConfig())
    distinct = [list(dict.fromkeys(i["item_id"] for i in s["items"])) for s in sets]
    sizes = np.array([len(d) for d in distinct])
    assert report["layout"] == "polyvore" and report["sets"] == len(sets)
    assert report["sets_kept"] == int(((sizes >= 4) & (sizes <= 8)).sum())
    assert report["sets_dropped"] == {"too_small": int((sizes < 4).sum()), "too_large": int((sizes > 8).sum())}
    assert report["sets_kept"] + sum(report["sets_dropped"].values()) == report["sets"]
    assert report["pairs"] == sum(len(s["items"]) for s in sets)
    assert report["pairs_duplicate_dropped"] == report["pairs"] - int(sizes.sum())
    outfits = pd.read_parquet(tmp_path / "raw" / "outfits.parquet")
    assert outfits["customer_id"].isna().all() and report["outfits_without_customer"] == len(outfits)
    by_id = dict(zip(outfits["outfit_id"], outfits["article_ids"].map(list)))
    for s, d in zip(sets, distinct):
        if 4 <= len(d) <= 8:
            assert by_id[s["set_id"]] == d  # in the order the set lists them, duplicates once
    articles = pd.read_parquet(tmp_path / "raw" / "articles.parquet")
    assert set(articles["article_id"]) == set(outfits["article_ids"].explode())
    assert articles[["product_type", "brand", "color", "style", "price"]].isna().all().all()
    assert pd.read_parquet(tmp_path / "raw" / "customers.parquet").empty
    assert DataSchema.load(tmp_path / "raw").context_columns == ()


def test_pairs_without_an_outfit_or_item_id_are_quarantined_with_their_line(tmp_path):
    _, sets = write_polyvore(tmp_path / "train.json", n_sets=40)
    lines = write_pairs_csv(tmp_path / "pairs.csv", sets).read_text().splitlines()
    lines[3:3] = [",item_x", "look_y,  "]  # lines 4 and 5: no outfit id, an item id of spaces only
    (tmp_path / "pairs.csv").write_text("\n".join(lines) + "\n")
    report = import_sets(tmp_path / "pairs.csv", tmp_path / "raw", ImportSetsConfig())
    clean = import_sets(tmp_path / "train.json", tmp_path / "clean", ImportSetsConfig())
    assert report["sets_kept"] == clean["sets_kept"] and report["pairs_malformed_dropped"] == 2
    quarantine = pq.read_table(tmp_path / "raw" / IMPORT_QUARANTINE).to_pylist()
    assert [(r["file"], r["line"], r["column"], r["reason"], r["text"]) for r in quarantine] == [
        ("pairs.csv", 4, "outfit_id", "no outfit id", ",item_x,"),
        ("pairs.csv", 5, "item_id", "no item id", "look_y,,"),
    ]
    assert report["quarantined"] == {"file": IMPORT_QUARANTINE, "rows": 2}
    assert pq.read_table(tmp_path / "clean" / IMPORT_QUARANTINE).num_rows == clean["quarantined"]["rows"] == 0

    sets[2]["items"][1]["item_id"] = ""  # the Polyvore layout: the set's place in the list
    (tmp_path / "train.json").write_text(json.dumps(sets))
    import_sets(tmp_path / "train.json", tmp_path / "polyvore", ImportSetsConfig())
    (row,) = pq.read_table(tmp_path / "polyvore" / IMPORT_QUARANTINE).to_pylist()
    assert (row["line"], row["column"], row["reason"]) == (3, "item_id", "no item id")


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl"])
def test_two_column_pairs_give_the_same_outfits(tmp_path, suffix):
    """... whatever the letter case of the column names."""
    source, sets = write_polyvore(tmp_path / "train.json")
    import_sets(source, tmp_path / "from_json", ImportSetsConfig())
    pairs = pd.read_csv(write_pairs_csv(tmp_path / "pairs.csv", sets), dtype=str)
    path = tmp_path / f"pairs{suffix}"
    if suffix == ".parquet":
        pairs.rename(columns={"outfit_id": "Look", "item_id": "SKU"}).to_parquet(path)
        cfg = ImportSetsConfig(outfit_column="look", item_column="sku")
    elif suffix == ".jsonl":
        pairs.rename(columns=str.upper).to_json(path, orient="records", lines=True)
        cfg = ImportSetsConfig()
    else:
        pairs.rename(columns=str.title).to_csv(path, index=False)
        cfg = ImportSetsConfig()
    report = import_sets(path, tmp_path / "raw", cfg)
    assert report["layout"] == "pairs"
    expected = pd.read_parquet(tmp_path / "from_json" / "outfits.parquet")
    got = pd.read_parquet(tmp_path / "raw" / "outfits.parquet")
    assert got["outfit_id"].tolist() == expected["outfit_id"].tolist()
    assert got["article_ids"].map(list).tolist() == expected["article_ids"].map(list).tolist()


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_one_row_per_set_with_its_items_as_a_list_gives_the_same_outfits(tmp_path, suffix):
    """The item column holding each set's items as a list (a row with one item, or a set spread over rows, adds
    up); an empty list and a null in a list are pairs without an item id, quarantined with their row."""
    source, sets = write_polyvore(tmp_path / "train.json")
    import_sets(source, tmp_path / "from_json", ImportSetsConfig())
    rows = pd.DataFrame(
        {"outfit_id": [s["set_id"] for s in sets], "item_id": [[i["item_id"] for i in s["items"]] for s in sets]}
    )
    first = rows.at[1, "item_id"][0]
    rows.at[1, "item_id"] = first if suffix == ".jsonl" else [first]  # one item (JSON: as is; Parquet: a list) ...
    rows.loc[len(rows)] = [sets[1]["set_id"], [i["item_id"] for i in sets[1]["items"][1:]]]  # ... the rest later
    rows.loc[len(rows)] = ["empty", []]
    rows.loc[len(rows)] = [sets[0]["set_id"], [None]]
    path = tmp_path / f"sets{suffix}"
    rows.to_parquet(path) if suffix == ".parquet" else rows.to_json(path, orient="records", lines=True)
    report = import_sets(path, tmp_path / "raw", ImportSetsConfig())
    assert report["layout"] == "item_lists" and report["pairs"] == sum(len(s["items"]) for s in sets) + 2
    expected = pd.read_parquet(tmp_path / "from_json" / "outfits.parquet")
    got = pd.read_parquet(tmp_path / "raw" / "outfits.parquet")
    assert got["outfit_id"].tolist() == expected["outfit_id"].tolist()
    assert got["article_ids"].map(list).tolist() == expected["article_ids"].map(list).tolist()
    quarantine = pq.read_table(tmp_path / "raw" / IMPORT_QUARANTINE).to_pylist()
    assert [(r["line"], r["column"], r["reason"]) for r in quarantine] == [
        (len(sets) + 2, "item_id", "no item id"),
        (len(sets) + 3, "item_id", "no item id"),
    ]


def test_polyvore_items_as_ids_and_sets_keyed_by_id_give_the_same_outfits(tmp_path):
    source, sets = write_polyvore(tmp_path / "train.json")
    import_sets(source, tmp_path / "from_json", ImportSetsConfig())
    expected = pd.read_parquet(tmp_path / "from_json" / "outfits.parquet")
    ids = [[i["item_id"] for i in s["items"]] for s in sets]
    layouts = {
        "ids": [{"set_id": s["set_id"], "items": i} for s, i in zip(sets, ids)],
        "keyed": {s["set_id"]: {"items": s["items"]} for s in sets},
        "keyed_ids": {s["set_id"]: i for s, i in zip(sets, ids)},
    }
    for name, layout in layouts.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(layout))
        report = import_sets(tmp_path / f"{name}.json", tmp_path / name, ImportSetsConfig())
        got = pd.read_parquet(tmp_path / name / "outfits.parquet")
        assert report["layout"] == "polyvore" and got["outfit_id"].tolist() == expected["outfit_id"].tolist(), name
        assert got["article_ids"].map(list).tolist() == expected["article_ids"].map(list).tolist(), name


@pytest.mark.parametrize("name", ["pairs.csv.gz", "pairs.jsonl.gz", "train.json.gz"])
def test_gzipped_text_gives_the_same_outfits_and_lines(tmp_path, name):
    source, sets = write_polyvore(tmp_path / "train.json", n_sets=60)
    import_sets(source, tmp_path / "plain", ImportSetsConfig())
    pairs = pd.read_csv(write_pairs_csv(tmp_path / "pairs.csv", sets), dtype=str)
    text = {
        "pairs.csv.gz": pairs.assign(user="u1").to_csv(index=False) + ",no_outfit,u1\n",  # quarantined
        "pairs.jsonl.gz": pairs.to_json(orient="records", lines=True),
        "train.json.gz": source.read_text(),
    }[name]
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()))
    customers = tmp_path / "customers.csv.gz"  # the customers table gzipped too
    customers.write_bytes(gzip.compress(b"user,age\nu1,30\n"))
    cfg = ImportSetsConfig(customers=customers, customer_column="user", context={"age": "numeric"}) \
        if name == "pairs.csv.gz" else ImportSetsConfig()  # fmt: skip
    import_sets(path, tmp_path / "raw", cfg)
    expected = pd.read_parquet(tmp_path / "plain" / "outfits.parquet")
    got = pd.read_parquet(tmp_path / "raw" / "outfits.parquet")
    assert got["article_ids"].map(list).tolist() == expected["article_ids"].map(list).tolist()
    if name == "pairs.csv.gz":
        (row,) = pq.read_table(tmp_path / "raw" / IMPORT_QUARANTINE).to_pylist()
        assert (row["file"], row["line"], row["reason"]) == (name, len(pairs) + 2, "no outfit id")
        customers = pd.read_parquet(tmp_path / "raw" / "customers.parquet")  # text: validation types it
        assert customers.to_dict("list") == {"customer_id": ["u1"], "age": ["30"]}

    path.write_bytes(gzip.compress(text.encode())[:-40])  # cut short: not a silently shorter file
    with pytest.raises(DataError, match=rf"{name.replace('.', '[.]')}: not a readable gzip file"):
        import_sets(path, tmp_path / "cut", ImportSetsConfig())
    path.write_bytes(text.encode())  # named .gz, stored plain
    with pytest.raises(DataError, match=rf"{name.replace('.', '[.]')}: not a readable gzip file"):
        import_sets(path, tmp_path / "plain_bytes", ImportSetsConfig())


@pytest.mark.parametrize("delim", [",", ";", "\t"])
def test_lines_that_cannot_be_read_are_quarantined_and_the_rest_imported(tmp_path, delim):
    _, sets = write_polyvore(tmp_path / "train.json", n_sets=40)
    name = "pairs.tsv" if delim == "\t" else "pairs.csv"
    lines = [line.replace(",", delim) for line in write_pairs_csv(tmp_path / name, sets).read_text().splitlines()]
    bad = {
        5: (f"look_x{delim}item_x{delim}extra", "item_id", "too many fields"),
        9: ("look_x", "item_id", "too few fields"),
        12: (f'"look_x{delim}item_x', "outfit_id", "a quote left open or misplaced"),
        20: (b"look_x" + delim.encode() + b"caf\xe9", "outfit_id", "not UTF-8 text"),
    }
    data = [line.encode() for line in lines]
    for at, (text, _, _) in sorted(bad.items()):  # at: its line in the file
        data.insert(at - 1, text if isinstance(text, bytes) else text.encode())
    data.insert(15, b"")  # a blank line: skipped, not a pair
    (tmp_path / name).write_bytes(b"\r\n".join(data) + b"\r\n")  # and Windows line ends
    report = import_sets(tmp_path / name, tmp_path / "raw", ImportSetsConfig())
    import_sets(tmp_path / "train.json", tmp_path / "clean", ImportSetsConfig())
    for table in ("outfits", "articles"):
        assert pq.read_table(tmp_path / "raw" / f"{table}.parquet").equals(
            pq.read_table(tmp_path / "clean" / f"{table}.parquet")
        )
    quarantine = pq.read_table(tmp_path / "raw" / IMPORT_QUARANTINE).to_pylist()
    lines_at = {at + (at > 15) for at in bad}  # the blank line moved those after it
    assert [(r["file"], r["line"], r["column"], r["reason"].split(" (")[0]) for r in quarantine] == [
        (name, at + (at > 15), column, reason) for at, (_, column, reason) in sorted(bad.items())
    ]
    assert {r["line"] for r in quarantine} == lines_at and "look_x" in quarantine[-1]["text"]
    # counts add up: the file's lines = header + blank + pairs read + lines not read
    assert len(data) == 1 + 1 + report["pairs"] + report["lines_rejected"][name]
    assert report["quarantined"]["rows"] == report["lines_rejected"][name] == len(bad)


def test_a_customers_line_that_cannot_be_read_is_quarantined(tmp_path):
    (tmp_path / "pairs.csv").write_text("".join(f"o{o};i{i};u{o % 2}\n" for o in range(3) for i in range(o, o + 5)))
    (tmp_path / "pairs.csv").write_text("look;item;user\n" + (tmp_path / "pairs.csv").read_text())
    (tmp_path / "customers.csv").write_text("User|REGION\nu0|north\nu1|south|extra\n")  # names in any case
    cfg = ImportSetsConfig(
        outfit_column="look",
        item_column="item",
        customer_column="user",
        customers=tmp_path / "customers.csv",
        context={"region": "categorical"},
    )
    report = import_sets(tmp_path / "pairs.csv", tmp_path / "raw", cfg)
    assert report["sets_kept"] == 3 and report["rows"]["customers"] == 1
    assert report["outfits_without_customer_row"] == 1  # u1's row was not read
    (row,) = pq.read_table(tmp_path / "raw" / IMPORT_QUARANTINE).to_pylist()
    assert (row["file"], row["line"], row["column"], row["reason"], row["text"]) == (
        "customers.csv",
        3,
        "region",
        "too many fields (3, not 2)",
        "u1|south|extra",
    )
    assert report["lines_rejected"] == {"pairs.csv": 0, "customers.csv": 1}


def test_customers_with_declared_context_validate_and_become_features(tmp_path):
    _, sets = write_polyvore(tmp_path / "train.json", n_sets=400)
    rng = np.random.default_rng(1)
    pairs = pd.read_csv(write_pairs_csv(tmp_path / "pairs.csv", sets), dtype=str)
    customer_of = {s["set_id"]: f"u{rng.integers(0, 60)}" for s in sets}
    pairs["user"] = pairs["outfit_id"].map(customer_of)
    pairs.loc[pairs["outfit_id"] == sets[0]["set_id"], "user"] = "u-without-row"
    pairs.to_csv(tmp_path / "pairs.csv", index=False)
    customers = pd.DataFrame({
        "user": [f"u{i}" for i in range(60)],
        "region": rng.choice(["north", "south", "east"], 60),
        "styles": [rng.choice(["casual", "sport", "formal", "boho"], rng.integers(0, 3), replace=False).tolist()
                   for _ in range(60)],
        "age": rng.integers(18, 70, 60).astype(float),
    })  # fmt: skip
    customers["styles"] = customers["styles"].map(lambda v: "|".join(v))  # CSV: a|b text
    customers.loc[3, "age"] = np.nan
    customers.to_csv(tmp_path / "customers.csv", index=False)
    cfg = ImportSetsConfig(
        customer_column="user",
        customers=tmp_path / "customers.csv",
        context={"region": "categorical", "styles": "multi_categorical", "age": "numeric"},
    )
    report = import_sets(tmp_path / "pairs.csv", tmp_path / "raw", cfg)
    assert report["outfits_without_customer"] == 0 and report["rows"]["customers"] == 60
    assert report["outfits_without_customer_row"] == (1 if 4 <= len({i["item_id"] for i in sets[0]["items"]}) <= 8
                                                      else 0)  # fmt: skip
    summary = validate(tmp_path / "raw", tmp_path / "validated", tmp_path / "quarantine", tmp_path / "reports",
                       ValidateConfig())  # fmt: skip
    assert summary["passed"] and summary["tables"]["customers"]["quarantined"] == 0
    cfg = FeaturesConfig(default_dim=8, val_fraction=0.15, test_fraction=0.15)
    manifest = build_features(tmp_path / "validated", tmp_path / "features", cfg, 8)
    assert {f["name"]: f["kind"] for f in manifest["spec"]} == {
        "region": "categorical",
        "styles": "multi_categorical",
        "age": "numeric",
    }
    assert manifest["d_context"] == 24
    train = load_split(tmp_path / "features", "train", 8)
    assert set(train.context) == {"region", "styles", "age"}


def test_bad_input_is_a_one_line_error(tmp_path):
    (tmp_path / "sets.json").write_text(json.dumps([{"set_id": "1", "items": [{"id": "x"}]}]))
    with pytest.raises(
        DataError,
        match=r"sets\.json, row 0, column 'items': an item of a set must be its id or an "
        r"object with 'item_id'$",
    ):
        import_sets(tmp_path / "sets.json", tmp_path / "raw", ImportSetsConfig())
    (tmp_path / "pairs.csv").write_text("outfit,item_id\n1,a\n")
    with pytest.raises(DataError, match=r"pairs\.csv, column 'outfit_id': required column missing"):
        import_sets(tmp_path / "pairs.csv", tmp_path / "raw", ImportSetsConfig())
    (tmp_path / "pairs.csv").write_text("outfit_id,item_id,user\n1,a,u1\n1,b,u2\n")
    with pytest.raises(DataError, match="outfit '1' names 2 different customers"):
        import_sets(tmp_path / "pairs.csv", tmp_path / "raw", ImportSetsConfig(customer_column="user"))
    with pytest.raises(DataError, match="unknown suffix"):
        (tmp_path / "pairs.txt").write_text("x")
        import_sets(tmp_path / "pairs.txt", tmp_path / "raw", ImportSetsConfig())
    (tmp_path / "pairs.csv").write_text("outfit_id,item_id\n1,a\n1,b\n2,c\n")  # no set large enough
    with pytest.raises(
        DataError,
        match=r"pairs\.csv: no outfit kept: of 2 sets none has 4-8 distinct items "
        r"\(2 too small, 0 too large\)",
    ):
        import_sets(tmp_path / "pairs.csv", tmp_path / "raw", ImportSetsConfig())
    assert json.loads((tmp_path / "raw" / "ingest_report.json").read_text())["sets_kept"] == 0  # why, to read


def test_a_context_variant_on_data_without_context_is_not_applicable_and_says_why(tmp_path):
    source, _ = write_polyvore(tmp_path / "train.json", n_sets=600)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "paths": {k: str(tmp_path / v) for k, v in [("raw_dir", "raw"), ("validated_dir", "validated"),
                  ("quarantine_dir", "quarantine"), ("features_dir", "features"), ("models_dir", "models"),
                  ("reports_dir", "reports")]},
        "ingest": {"source": "sets"}, "import_sets": {"source": str(source)}, "model": TINY_MODEL,
        "train": {"max_epochs": 1, "device": "cpu", "num_threads": 1},
    }))  # fmt: skip
    for stage in ("ingest", "validate", "features"):
        assert main(["--params", str(params), stage]) == 0, stage
    from contextual_bert.config import load_config
    from contextual_bert.evaluation.evaluate import evaluate_run
    from contextual_bert.training import train

    cfg = load_config(params)
    result = train(cfg.paths.features_dir, tmp_path / "models" / "gs", "global_state", 0, cfg.model, cfg.train)
    assert "conditions on the customer context" in result["not_applicable"]
    assert not (tmp_path / "models" / "gs" / "checkpoint.pt").exists()
    evaluated = evaluate_run(cfg.paths.features_dir, tmp_path / "models" / "gs", tmp_path / "gs.json", cfg.evaluate)
    assert evaluated["known"] is False and evaluated["why"] == result["not_applicable"]
    assert result["model"] == evaluated["model"] == "global_state"
    # a metrics.json written before issue 92 named the model "variant": still read
    metrics = tmp_path / "models" / "gs" / "metrics.json"
    old = json.loads(metrics.read_text())
    old["variant"] = old.pop("model")
    metrics.write_text(json.dumps(old))
    again = evaluate_run(cfg.paths.features_dir, tmp_path / "models" / "gs", tmp_path / "gs.json", cfg.evaluate)
    assert again == evaluated
    # the models that read no context train on it: the bag of items too
    bag = train(cfg.paths.features_dir, tmp_path / "models" / "bag", "bag_of_items", 0, cfg.model, cfg.train)
    assert bag["epochs"] == 1 and (tmp_path / "models" / "bag" / "checkpoint.pt").exists()


@pytest.mark.slow
def test_dvc_repro_of_a_newcomers_outfit_pairs_with_the_defaults(tmp_path):
    """`dvc repro` through Table 1 on a newcomer's outfits CSV, (outfit, item) pairs only, with only
    ingest.source and import_sets' source set (and sizes made small for the test's time): the models that read no
    context train, the models that read it say why they cannot, the attribute rows that there are no attributes."""
    project = tmp_path / "project"
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    dvc, env = dvc_project(project, MLFLOW_TRACKING_URI=tracking_uri)
    (project / "data").mkdir()
    write_pairs_csv(project / "data" / "outfits.csv", polyvore_sets(n_sets=800, n_items=80))
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["ingest"]["source"] = "sets"
    params["import_sets"]["source"] = "data/outfits.csv"
    # only to keep the test short: a tiny model, one seed, one epoch
    params["model"].update(TINY_MODEL)
    params["train"].update({"seeds": [0], "max_epochs": 1})
    params["mlflow"]["tracking_uri"] = tracking_uri
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    run = subprocess.run([str(dvc), "repro", "report"], cwd=project, capture_output=True, text=True, env=env,
                         timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ingest = json.loads((project / "data" / "raw" / "ingest_report.json").read_text())
    assert ingest["source"] == "sets" and ingest["layout"] == "pairs" and ingest["sets_kept"] > 300
    assert json.loads((project / "reports" / "eval" / "popularity_attribute.json").read_text())["known"] is False
    table = (project / "reports" / "table1.md").read_text()
    assert "| [None] |" in table and "| Bag of items |" in table and "| Popularity |" in table
    assert "| [GS] |" not in table and "- Not trained on this data: [C], [NP], [GS], [GSU], Bag of items + c" in table
    assert "No context" in table
    none = json.loads((project / "reports" / "eval" / "none-s0.json").read_text())
    low, high = none["test_bootstrap"]["recall@5"]
    assert low <= none["test"]["recall@5"] <= high


def test_import_sets_command_reads_a_two_column_csv(tmp_path, capsys):
    _, sets = write_polyvore(tmp_path / "train.json")
    pairs = write_pairs_csv(tmp_path / "pairs.csv", sets)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"paths": {"raw_dir": str(tmp_path / "raw")}}))
    assert main(["--params", str(params), "import-sets", "--source", str(pairs)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layout"] == "pairs" and report["sets_kept"] == len(
        pd.read_parquet(tmp_path / "raw" / "outfits.parquet")
    )
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    assert main(["--params", str(params), "import-sets", "--source", str(tmp_path / "bad.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.csv, column 'outfit_id': required column missing" in err[0]


# --- dates (import_sets.date_column) --------------------------------------------------------------------


def _dated_pairs(path: Path, dates: dict[str, list]) -> Path:
    """Pairs of outfits o<k> (5 items each), the date column as given per outfit (one value per row)."""
    rows = [(outfit, f"i{k}_{i}", day) for k, (outfit, days) in enumerate(dates.items()) for i, day in enumerate(days)]
    pd.DataFrame(rows, columns=["outfit_id", "item_id", "when"]).to_csv(path, index=False)
    return path


def test_a_date_column_dates_the_outfits_and_bad_dates_go_to_the_quarantine(tmp_path):
    dates = {
        "o0": ["2020-03-01"] * 5,
        "o1": ["2020-03-02", None, None, "2020-03-02", "2020-03-02"],
        "o2": ["2020-03-01", "2020-03-02", "2020-03-01", "2020-03-01", "2020-03-01"],  # disagree
        "o3": ["2020-03-01", "soon", "2020-03-01", "2020-03-01", "2020-03-01"],  # unreadable
        "o4": [None] * 5,
    }  # none
    source = _dated_pairs(tmp_path / "pairs.csv", dates)
    report = import_sets(source, tmp_path / "raw", ImportSetsConfig(date_column="when"))
    outfits = pq.read_table(tmp_path / "raw" / "outfits.parquet")
    assert outfits.schema.field(DATE_COLUMN).type == DATE_TYPE
    got = dict(zip(outfits.column("outfit_id").to_pylist(), map(str, outfits.column(DATE_COLUMN).to_pylist())))
    assert got == {"o0": "2020-03-01", "o1": "2020-03-02"}  # a row without a date takes its outfit's
    assert report["sets_dropped"]["date"] == 3 and report["sets"] == report["sets_kept"] + 3
    quarantine = pd.read_parquet(tmp_path / "raw" / IMPORT_QUARANTINE)
    assert len(quarantine) == 15 == report["quarantined"]["rows"]  # every pair of the three outfits
    assert set(quarantine["column"]) == {"when"}
    reasons = quarantine.assign(outfit=quarantine["text"].str.split(",").str[0]).groupby("outfit")["reason"]
    assert set(reasons.get_group("o2")) == {"the outfit's rows disagree on the date"}
    assert sorted(set(reasons.get_group("o3"))) == [
        "another row of its outfit has no readable date",
        "not a date (a date (YYYY-MM-DD) or an integer sequence number)",
    ]
    assert set(reasons.get_group("o4")) == {"the outfit has no date"}
    # the quarantined line is the row's line in the CSV (header: line 1)
    assert quarantine.loc[quarantine["reason"].str.startswith("not a date"), "line"].tolist() == [2 + 3 * 5 + 1]


def test_an_integer_date_is_a_sequence_number_from_1970_01_01(tmp_path):
    source = _dated_pairs(tmp_path / "pairs.csv", {"a": [3] * 5, "b": [0] * 5, "c": [400] * 5})
    import_sets(source, tmp_path / "raw", ImportSetsConfig(date_column="when"))
    outfits = pq.read_table(tmp_path / "raw" / "outfits.parquet")
    got = dict(zip(outfits.column("outfit_id").to_pylist(), map(str, outfits.column(DATE_COLUMN).to_pylist())))
    assert got == {"a": "1970-01-04", "b": "1970-01-01", "c": "1971-02-05"}
    # the same from Parquet, where the column is integers
    pd.read_csv(source).to_parquet(tmp_path / "pairs.parquet")
    import_sets(tmp_path / "pairs.parquet", tmp_path / "raw2", ImportSetsConfig(date_column="when"))
    assert pq.read_table(tmp_path / "raw2" / "outfits.parquet").column(DATE_COLUMN).equals(outfits.column(DATE_COLUMN))


def test_without_date_column_the_outfits_carry_no_date(tmp_path):
    source = _dated_pairs(tmp_path / "pairs.csv", {"a": [3] * 5})
    report = import_sets(source, tmp_path / "raw", ImportSetsConfig())
    assert DATE_COLUMN not in pq.read_table(tmp_path / "raw" / "outfits.parquet").column_names
    assert "date" not in report["sets_dropped"]
