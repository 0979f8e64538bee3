"""The table of data sources and the `source` stage: DVC sees a change in the files a source reads."""

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import dvc_project, hm_fixture

from contextual_bert.config import Config
from contextual_bert.data.sources import SOURCES, fingerprint, hash_cache_path, write_fingerprint
from contextual_bert.data.sources.hm_files import TRANSACTIONS
from contextual_bert.errors import DataError


def _hm_config(source: Path, tmp_path: Path) -> Config:
    return Config.model_validate({"ingest": {"source": "hm"}, "import_hm": {"source": str(source)},
                                  "paths": {"source_fingerprint": str(tmp_path / "source.json")}})  # fmt: skip


def test_every_source_names_the_files_it_reads(tmp_path):
    for name in ("synthetic", "planted"):
        assert SOURCES[name].inputs(Config.model_validate({"ingest": {"source": name}})) == []
    source = hm_fixture(tmp_path / "hm")
    (source / "articles.parquet").write_bytes(b"")  # a second form of one file: the import's own error
    with pytest.raises(DataError, match="both hold articles"):
        SOURCES["hm"].inputs(_hm_config(source, tmp_path))
    (source / "articles.parquet").unlink()
    assert [p.name for p in SOURCES["hm"].inputs(_hm_config(source, tmp_path))] == [
        TRANSACTIONS,
        "customers.csv",
        "articles.csv",
    ]
    sets = Config.model_validate({"ingest": {"source": "sets"}, "import_sets": {"source": str(tmp_path / "no.csv")}})
    with pytest.raises(DataError, match="no.csv: file not found"):
        SOURCES["sets"].inputs(sets)


def test_the_fingerprint_follows_the_files_content_not_their_time(tmp_path):
    source = hm_fixture(tmp_path / "hm")
    cfg = _hm_config(source, tmp_path)
    first = write_fingerprint(cfg)
    assert first["source"] == "hm" and [f["path"] for f in first["files"]] == [
        str(source / name) for name in (TRANSACTIONS, "customers.csv", "articles.csv")
    ]
    written = cfg.paths.source_fingerprint.stat().st_mtime_ns
    os.utime(source / TRANSACTIONS)  # touched, same bytes: same fingerprint, the file is left as it was
    assert write_fingerprint(cfg) == first and cfg.paths.source_fingerprint.stat().st_mtime_ns == written
    data = (source / TRANSACTIONS).read_bytes()
    (source / TRANSACTIONS).write_bytes(data.replace(b"0.0100", b"0.0101", 1))
    assert fingerprint(cfg)["files"][0]["md5"] != first["files"][0]["md5"]
    (source / TRANSACTIONS).unlink()  # stored another way: another file
    (source / f"{TRANSACTIONS}.gz").write_bytes(gzip.compress(data))
    assert fingerprint(cfg)["files"][0]["path"].endswith(".csv.gz")


def test_a_file_unchanged_since_its_last_hashing_is_not_read_again(tmp_path, monkeypatch):
    import hashlib

    source = hm_fixture(tmp_path / "hm")
    cfg = _hm_config(source, tmp_path)
    read = []
    digest = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda f, name: read.append(Path(f.name).name) or digest(f, name))
    first = write_fingerprint(cfg)
    assert read == [TRANSACTIONS, "customers.csv", "articles.csv"]
    read.clear()
    assert write_fingerprint(cfg) == first and read == []  # size, time and inode as hashed: the md5 kept
    data = (source / TRANSACTIONS).read_bytes()
    (source / TRANSACTIONS).write_bytes(data.replace(b"0.0100", b"0.0101", 1))  # same size, new content
    changed = write_fingerprint(cfg)
    assert read == [TRANSACTIONS] and changed["files"][0]["md5"] != first["files"][0]["md5"]
    os.utime(source / "customers.csv", ns=(1, 1))  # touched back in time: read again, the same md5
    read.clear()
    assert write_fingerprint(cfg) == changed and read == ["customers.csv"]
    for spoiled in ("{not json", "[1, 2]", f'{{"{(source / TRANSACTIONS).resolve()}": 7}}'):
        hash_cache_path(cfg).write_text(spoiled)  # a spoiled cache: every file hashed, nothing wrong
        read.clear()
        assert write_fingerprint(cfg) == changed and len(read) == 3


@pytest.mark.slow
def test_dvc_repro_reruns_ingest_exactly_when_the_source_files_change(tmp_path):
    project = tmp_path / "project"
    dvc, env = dvc_project(project)
    source = hm_fixture(project / "hm")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["ingest"]["source"], params["import_hm"]["source"] = "hm", "hm"
    (project / "params.yaml").write_text(yaml.safe_dump(params))

    def repro() -> str:
        run = subprocess.run([str(dvc), "repro", "ingest"], cwd=project, capture_output=True, text=True, env=env,
                             timeout=300)  # fmt: skip
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        return run.stdout

    assert "Running stage 'ingest'" in repro()
    assert "Stage 'ingest' didn't change, skipping" in repro()  # the source stage ran, and found the same files
    rows = (source / TRANSACTIONS).read_text().splitlines()
    (source / TRANSACTIONS).write_text("\n".join(rows[:-1]) + "\n")  # the same path, other content
    assert "Running stage 'ingest'" in repro()


def test_an_unknown_source_is_a_one_line_error_of_the_stages_that_read_sources_only(tmp_path):
    from contextual_bert.cli import main

    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump({"ingest": {"source": "nope"}, "paths": {"source_fingerprint": str(tmp_path / "source.json")}})
    )
    Config.model_validate(yaml.safe_load(params.read_text()))  # loads: the trainings never read ingest.source
    for stage in ("ingest", "source"):
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "contextual-bert"), "--params", str(params), stage],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines() == [
            f"contextual-bert {stage}: error: params.yaml: ingest.source 'nope' is not one of {sorted(SOURCES)}"
        ]
    assert main(["--params", str(params), "import-sets", "--source", str(tmp_path / "missing.json")]) == 2
