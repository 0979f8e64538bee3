"""The one table of data sources: `ingest.source` names an entry, `contextual-bert ingest` runs it.

Each source is one module with `ingest(cfg: Config, source: Path | None) -> dict`: it writes the raw data
contract (contract.py) into `cfg.paths.raw_dir` and returns its ingest report. `schema` gives the context
columns it declares. A new source is one module and one entry here (and, when it takes settings, its own
params section); config.py accepts every name of this table for `ingest.source`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contextual_bert.contract import HM_SCHEMA, PAPER_SCHEMA, DataSchema


@dataclass(frozen=True)
class Source:
    module: str  # imported only when the source runs: sources pull in heavy readers (DuckDB)
    params: str  # the params section the source reads (its DVC params)
    schema: Callable[..., DataSchema]  # cfg -> the context columns the source declares
    about: str

    def ingest(self, cfg, source: Path | None = None) -> dict:
        return importlib.import_module(self.module).ingest(cfg, source)


def _sets_schema(cfg) -> DataSchema:
    from contextual_bert.import_sets import sets_schema

    return sets_schema(cfg.import_sets)


SOURCES: dict[str, Source] = {
    "synthetic": Source("contextual_bert.generator", "generate", lambda cfg: PAPER_SCHEMA,
                        "synthetic stylist outfits with the paper's customer context"),
    "hm": Source("contextual_bert.importers", "import_hm", lambda cfg: HM_SCHEMA,
                 "H&M Kaggle transactions, grouped into baskets; customers.csv columns as context"),
    "sets": Source("contextual_bert.import_sets", "import_sets", _sets_schema,
                   "curated sets (outfit id, item id) or Polyvore Outfits JSON; customers optional"),
}  # fmt: skip


def ingest(cfg, source: Path | None = None) -> dict:
    """Run the source `ingest.source` names; `source` overrides the path in its params section."""
    return SOURCES[cfg.ingest.source].ingest(cfg, source)
