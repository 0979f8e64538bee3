"""The one table of data sources: `ingest.source` names an entry, `contextual-bert ingest` runs it.

Each source is one module with `ingest(cfg: Config, source: Path | None) -> dict`, which writes the raw
data contract (contract.py) into `cfg.paths.raw_dir` and returns its ingest report, `schema(cfg) ->
DataSchema`, the context columns it declares, and `inputs(cfg) -> list[Path]`, the files it reads (for the
`source` stage's fingerprint: params name those files, DVC cannot see into them). A new source is one module
and one entry here (and, when it takes settings, its own params section); `ingest.source` names one (`chosen`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass
from pathlib import Path

from contextual_bert.data.contract import DataSchema
from contextual_bert.data.vector_files import join_article_vectors, vector_inputs
from contextual_bert.errors import ContextualBertError


@dataclass(frozen=True)
class Source:
    # The module is named, not imported: sources pull in heavy readers (DuckDB), and the `source` stage
    # reads this table for one source's inputs.
    module: str  # with `ingest(cfg, source) -> dict` and `schema(cfg) -> DataSchema`
    params: str  # the params section the source reads (its DVC params)
    about: str

    def ingest(self, cfg, source: Path | None = None) -> dict:
        """The source's raw contract, with the article vectors of ingest.article_vectors joined, whatever the
        source (vector_files.py)."""
        return join_article_vectors(cfg, importlib.import_module(self.module).ingest(cfg, source))

    def schema(self, cfg) -> DataSchema:
        """The context columns the source declares."""
        return importlib.import_module(self.module).schema(cfg)

    def inputs(self, cfg) -> list[Path]:
        """The files the source reads (none for a generator); a missing one -> DataError."""
        return importlib.import_module(self.module).inputs(cfg)


SOURCES: dict[str, Source] = {
    "synthetic": Source("contextual_bert.data.sources.synthetic", "generate",
                        "synthetic stylist outfits with the paper's customer context"),
    "hm": Source("contextual_bert.data.sources.hm", "import_hm",
                 "H&M Kaggle transactions, grouped into baskets; customers.csv columns as context"),
    "sets": Source("contextual_bert.data.sources.sets", "import_sets",
                   "curated sets (outfit id, item id) or Polyvore Outfits JSON; customers optional"),
    "planted": Source("contextual_bert.data.sources.planted", "planted",
                      "planted customer signal whose exact Bayes-optimal predictor is known (optimum stage)"),
}  # fmt: skip


def chosen(cfg, name: str | None = None) -> Source:
    """The source `name` (default: `ingest.source`), or a one-line error naming the known ones. Checked here,
    where the table is, not when params.yaml loads: every stage reads the config, only these read sources."""
    name = name or cfg.ingest.source
    if name not in SOURCES:
        raise ContextualBertError(f"params.yaml: ingest.source '{name}' is not one of {sorted(SOURCES)}")
    return SOURCES[name]


def ingest(cfg, source: Path | None = None, name: str | None = None) -> dict:
    """Run the source `name` (default: `ingest.source`); `source` overrides the path in its params section."""
    return chosen(cfg, name).ingest(cfg, source)


def fingerprint(cfg) -> dict:
    """The files the chosen source reads and the article vectors' files (ingest.article_vectors), by content
    (path, bytes, md5): what the `source` stage writes to paths.source_fingerprint. That stage runs on every
    `dvc repro` (always_changed: params only name the files, so DVC cannot hash them itself); ingest depends on
    its output, so changed source files make ingest stale and unchanged ones leave it, and everything after it,
    alone. A file whose size, modification time and inode are those of its last hashing is not read again
    (hash_cache_path; DVC trusts the same signs): the full-size H&M files cost 7.9 s of md5 on every repro
    otherwise."""
    cache_path = hash_cache_path(cfg)
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}  # none yet, or unreadable: hash every file
    cache = cache if isinstance(cache, dict) else {}
    files, seen = [], {}
    for path in [*chosen(cfg).inputs(cfg), *vector_inputs(cfg)]:
        stat = path.stat()
        signs = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        key = str(path.resolve())
        entry = cache.get(key)
        md5 = entry.get("md5") if isinstance(entry, dict) and entry.get("signs") == signs else None
        if md5 is None:
            with open(path, "rb") as f:
                md5 = hashlib.file_digest(f, "md5").hexdigest()
        seen[key] = {"signs": signs, "md5": md5}
        files.append({"path": str(path), "bytes": stat.st_size, "md5": md5})
    if seen != cache:  # the files of this run only: the cache never grows past one source's
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_text(json.dumps(seen, indent=1) + "\n")
    return {"source": cfg.ingest.source, "files": files}


def hash_cache_path(cfg) -> Path:
    """Where fingerprint keeps the md5 of each file it last read, with the file's size, modification time and
    inode then: beside the fingerprint, not in it (DVC deletes a stage's output before it runs), ignored by
    git and DVC."""
    return cfg.paths.source_fingerprint.with_name(".source_hashes.json")


def write_fingerprint(cfg) -> dict:
    """fingerprint(cfg), written to paths.source_fingerprint (rewritten only when it changed)."""
    found, path = fingerprint(cfg), cfg.paths.source_fingerprint
    text = json.dumps(found, indent=2) + "\n"
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return found
