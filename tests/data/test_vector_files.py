"""Article vectors from files of their own (ingest.article_vectors, data/vector_files.py): joined into the raw
articles table after any source's ingest, bad rows quarantined with their reason, the file fingerprinted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from contextual_bert.cli import main
from contextual_bert.config import Config, load_config
from contextual_bert.config_sources import VectorFileConfig
from contextual_bert.data.contract import IMPORT_QUARANTINE
from contextual_bert.data.sources import fingerprint, ingest
from contextual_bert.data.vector_files import join_file
from contextual_bert.errors import DataError

PLANTED = {"n_outfits": 300, "n_articles": 60, "n_customers": 40, "n_types": 8, "n_tastes": 8}  # ids P_00..P_59
LENGTH = 4


def planted_cfg(tmp_path: Path, vectors: dict) -> Config:
    return Config.model_validate({
        "paths": {"raw_dir": str(tmp_path / "raw"), "source_fingerprint": str(tmp_path / "source.json")},
        "ingest": {"source": "planted", "article_vectors": vectors}, "planted": PLANTED,
    })  # fmt: skip


def write_vectors(path: Path, ids: list, vectors: list) -> Path:
    pq.write_table(pa.table({"Article_ID": ids, "vector": pa.array(vectors, pa.list_(pa.float32()))}), path)
    return path


def good(i: int) -> list[float]:
    return [float(i), 1.0, 0.0, -1.0]


def test_a_vectors_file_is_joined_into_the_articles_table_whatever_the_source(tmp_path):
    path = write_vectors(tmp_path / "clip.parquet", [f"P_{i:02d}" for i in range(50)], [good(i) for i in range(50)])
    report = ingest(planted_cfg(tmp_path, {"clip": {"path": str(path)}}))
    articles = pq.read_table(tmp_path / "raw" / "articles.parquet")
    assert articles.schema.field("clip").type == pa.list_(pa.float32())
    clip = articles.column("clip").to_pylist()
    ids = articles.column("article_id").to_pylist()
    assert clip[ids.index("P_07")] == good(7) and clip[ids.index("P_55")] is None  # kept, without a vector
    counts = report["article_vectors"]["clip"]
    assert counts == {"file": str(path), "length": LENGTH, "rows": 50, "joined": 50, "quarantined": {},
                      "articles_without_vector": 10}  # fmt: skip
    assert json.loads((tmp_path / "raw" / "ingest_report.json").read_text()) == report
    assert not (tmp_path / "raw" / IMPORT_QUARANTINE).exists()  # nothing to quarantine


def source_settings(tmp_path: Path, source: str) -> dict:
    """Each source's params for a small import (the H&M and retailer fixtures, small generators)."""
    from helpers import hm_fixture
    from test_products import RETAILER_SETS

    return {
        "synthetic": {"generate": {"size": "tiny"}},
        "planted": {"planted": PLANTED},
        "hm": {"import_hm": {"source": str(hm_fixture(tmp_path / "hm"))}},
        "sets": {"import_sets": RETAILER_SETS},
    }[source]


@pytest.mark.parametrize("source", ["synthetic", "planted", "hm", "sets"])
def test_every_source_gets_its_vectors_joined(tmp_path, source):
    settings = {"paths": {"raw_dir": str(tmp_path / "raw"), "source_fingerprint": str(tmp_path / "source.json")},
                "ingest": {"source": source}, **source_settings(tmp_path, source)}  # fmt: skip
    ingest(Config.model_validate(settings))
    ids = pq.read_table(tmp_path / "raw" / "articles.parquet").column("article_id").to_pylist()[:5]
    if source == "hm":  # as a file written from H&M's integer ids would hold them: without the leading zero
        ids = [int(a) for a in ids]
    path = write_vectors(tmp_path / "clip.parquet", [str(a) for a in ids], [good(i) for i in range(5)])
    settings["ingest"]["article_vectors"] = {"clip": {"path": str(path), "id_column": "Article_ID"}}
    cfg = Config.model_validate(settings)
    report = ingest(cfg)
    assert report["article_vectors"]["clip"]["joined"] == 5
    articles = pq.read_table(tmp_path / "raw" / "articles.parquet")
    assert sum(v is not None for v in articles.column("clip").to_pylist()) == 5
    assert str(path) in [f["path"] for f in fingerprint(cfg)["files"]]


def test_without_vectors_ingest_writes_what_it_wrote_before(tmp_path):
    cfg = planted_cfg(tmp_path, {})
    report = ingest(cfg)
    assert "article_vectors" not in report and "clip" not in pq.read_table(tmp_path / "raw" / "articles.parquet").schema
    assert fingerprint(cfg)["files"] == []


def test_bad_rows_are_quarantined_with_their_reason_and_the_counts_add_up(tmp_path):
    ids = ["P_00", "P_01", "P_02", "P_03", "P_04", "nope", "P_01", None, "P_05", "P_06", "P_07"]
    vectors = [good(0), [1.0, 2.0], [np.nan, 0, 0, 0], [np.inf, 0, 0, 0], good(4), good(5), good(6), good(7), None,
               [1.0, None, 0, 0], good(10)]  # fmt: skip
    path = write_vectors(tmp_path / "clip.parquet", ids, vectors)
    report = ingest(planted_cfg(tmp_path, {"clip": {"path": str(path), "id_column": "article_id"}}))
    quarantine = pq.read_table(tmp_path / "raw" / IMPORT_QUARANTINE).to_pandas()
    assert quarantine[["file", "line", "column", "reason"]].values.tolist() == [
        ["clip.parquet", 2, "vector", "2 values, not 4 as the other vectors"],
        ["clip.parquet", 3, "vector", "a missing, NaN or infinite value in the vector"],
        ["clip.parquet", 4, "vector", "a missing, NaN or infinite value in the vector"],
        ["clip.parquet", 6, "article_id", "no such article in the articles table"],
        ["clip.parquet", 7, "article_id", "article id listed before"],
        ["clip.parquet", 8, "article_id", "no article id"],
        ["clip.parquet", 9, "vector", "no vector"],
        ["clip.parquet", 10, "vector", "a missing, NaN or infinite value in the vector"],
    ]
    assert quarantine["text"].iloc[0] == "P_01,1.0,2.0"
    counts = report["article_vectors"]["clip"]
    assert counts["rows"] == counts["joined"] + sum(counts["quarantined"].values()) == len(ids)
    assert counts["joined"] == 3 and counts["articles_without_vector"] == PLANTED["n_articles"] - 3
    assert report["quarantined"] == {"file": IMPORT_QUARANTINE, "rows": 8}
    articles = pq.read_table(tmp_path / "raw" / "articles.parquet").to_pandas().set_index("article_id")
    assert articles["clip"].notna().sum() == 3 and list(articles.at["P_07", "clip"]) == good(10)
    assert articles.at["P_01", "clip"] is None  # its first row was bad: the second, listed after, is not taken


def test_a_npy_file_with_its_ids_beside_it(tmp_path):
    matrix = np.array([good(0), good(1), [np.nan, 0, 0, 0], good(3)], dtype=np.float32)
    np.save(tmp_path / "clip.npy", matrix)
    (tmp_path / "clip.ids.txt").write_text("P_00\nP_01\nP_02\nunknown\n")
    report = ingest(planted_cfg(tmp_path, {"clip": {"path": str(tmp_path / "clip.npy")}}))
    assert report["article_vectors"]["clip"]["joined"] == 2
    quarantine = pq.read_table(tmp_path / "raw" / IMPORT_QUARANTINE).to_pandas()
    assert quarantine[["file", "line", "reason"]].values.tolist() == [
        ["clip.ids.txt", 4, "no such article in the articles table"],
        ["clip.npy", 3, "a missing, NaN or infinite value in the vector"],
    ]
    cfg = planted_cfg(tmp_path, {"clip": {"path": str(tmp_path / "clip.npy")}})
    assert [Path(f["path"]).name for f in fingerprint(cfg)["files"]] == ["clip.npy", "clip.ids.txt"]
    (tmp_path / "clip.ids.txt").write_text("P_00\nP_01\n")
    with pytest.raises(DataError, match=r"clip.ids.txt: 2 ids for the 4 rows of clip.npy"):
        ingest(cfg)


def test_ids_match_as_a_typed_id_does_without_spaces_or_leading_zeros(tmp_path):
    ids = [108775015, " 0108775044 ", "108775051.0"]  # an integer column; spaces; a spreadsheet's number
    articles = ["0108775015", "0108775044", "0108775051", "0200000000"]  # H&M's ids, as the importer writes them
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"article_id": pa.array([str(i) for i in ids]),
                             "vector": pa.array([good(i) for i in range(3)], pa.list_(pa.float32()))}), path)  # fmt: skip
    column, quarantine, counts = join_file("clip", VectorFileConfig(path=path), articles)
    assert counts["joined"] == 3 and len(quarantine) == 0
    assert column.to_pylist() == [good(0), good(1), good(2), None]
    pq.write_table(pa.table({"article_id": pa.array([108775015], pa.int64()),
                             "vector": pa.array([good(0)], pa.list_(pa.float32()))}), path)  # fmt: skip
    column, _, counts = join_file("clip", VectorFileConfig(path=path), articles)
    assert counts["joined"] == 1 and column.to_pylist()[0] == good(0)


def test_bad_vectors_files_and_settings_are_one_line_errors(tmp_path):
    with pytest.raises(DataError, match=r"missing.parquet: file not found \(ingest.article_vectors\)"):
        fingerprint(planted_cfg(tmp_path, {"clip": {"path": str(tmp_path / "missing.parquet")}}))
    path = write_vectors(tmp_path / "clip.parquet", ["P_00"], [good(0)])
    with pytest.raises(DataError, match=r"clip.parquet, column 'emb': column not found"):
        ingest(planted_cfg(tmp_path, {"clip": {"path": str(path), "column": "emb"}}))
    with pytest.raises(DataError, match=r"column 'brand': ingest.article_vectors.brand is a column of the articles"):
        ingest(planted_cfg(tmp_path, {"brand": {"path": str(path)}}))
    none = write_vectors(tmp_path / "none.parquet", ["x", "y"], [good(0), good(1)])
    with pytest.raises(DataError, match=r"none.parquet: row 1: no such article in the articles table; no row of"):
        ingest(planted_cfg(tmp_path, {"clip": {"path": str(none)}}))
    with pytest.raises(ValueError, match=r"a vectors file is .parquet or .npy"):
        planted_cfg(tmp_path, {"clip": {"path": "clip.csv"}})


def test_the_vectors_file_is_fingerprinted_so_a_change_reruns_ingest(tmp_path):
    path = write_vectors(tmp_path / "clip.parquet", ["P_00"], [good(0)])
    cfg = planted_cfg(tmp_path, {"clip": {"path": str(path)}})
    before = fingerprint(cfg)
    assert [f["path"] for f in before["files"]] == [str(path)]
    write_vectors(path, ["P_00"], [good(1)])
    assert fingerprint(cfg)["files"][0]["md5"] != before["files"][0]["md5"]


def test_vectors_through_validate_and_features_to_the_catalogue(tmp_path):
    path = write_vectors(tmp_path / "clip.parquet", [f"P_{i:02d}" for i in range(40)], [good(i) for i in range(40)])
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "paths": {k: str(tmp_path / k) for k in ("raw_dir", "validated_dir", "quarantine_dir", "features_dir",
                                                 "reports_dir")} | {"source_fingerprint": str(tmp_path / "s.json")},
        "ingest": {"source": "planted", "article_vectors": {"clip": {"path": str(path)}}}, "planted": PLANTED,
        "features": {"article_features": True, "article_attributes": {"planted": {"clip": "vector", "style": "categorical"}},
                     "vector_normalize": {"clip": "l2"}, "min_split_outfits": 5, "min_known_targets": 5},
    }))  # fmt: skip
    for stage in ("source", "ingest", "validate", "features"):
        assert main(["--params", str(params), stage]) == 0, stage
    cfg = load_config(params)
    manifest = json.loads((cfg.paths.features_dir / "manifest.json").read_text())
    assert manifest["catalogue"]["missing"]["clip"] == PLANTED["n_articles"] - 40  # counted, kept
    assert manifest["params"]["vector_normalize"] == {"clip": "l2"}
    source = json.loads((tmp_path / "s.json").read_text())
    assert [f["path"] for f in source["files"]] == [str(path)]
    from contextual_bert.data.feature_store import load_catalogue

    catalogue = load_catalogue(cfg.paths.features_dir)
    stored = catalogue.attributes["clip"][catalogue.vocab.ids.index("P_03")]
    np.testing.assert_allclose(stored, np.asarray(good(3)) / np.linalg.norm(good(3)), rtol=1e-6)
