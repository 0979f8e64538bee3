"""The one table of data sources: `ingest.source` names an entry, `contextual-bert ingest` runs it.

Each source is one module with `ingest(cfg: Config, source: Path | None) -> dict`, which writes the raw
data contract (contract.py) into `cfg.paths.raw_dir` and returns its ingest report, and `schema(cfg) ->
DataSchema`, the context columns it declares. A new source is one module and one entry here (and, when it
takes settings, its own params section); config.py accepts every name of this table for `ingest.source`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from contextual_bert.contract import DataSchema


@dataclass(frozen=True)
class Source:
    # The module is named, not imported: sources pull in heavy readers (DuckDB), and config.py reads this
    # table to validate `ingest.source`, so every stage would otherwise depend on every importer's code.
    module: str  # with `ingest(cfg, source) -> dict` and `schema(cfg) -> DataSchema`
    params: str  # the params section the source reads (its DVC params)
    about: str

    def ingest(self, cfg, source: Path | None = None) -> dict:
        return importlib.import_module(self.module).ingest(cfg, source)

    def schema(self, cfg) -> DataSchema:
        """The context columns the source declares."""
        return importlib.import_module(self.module).schema(cfg)


SOURCES: dict[str, Source] = {
    "synthetic": Source("contextual_bert.generator", "generate",
                        "synthetic stylist outfits with the paper's customer context"),
    "hm": Source("contextual_bert.importers", "import_hm",
                 "H&M Kaggle transactions, grouped into baskets; customers.csv columns as context"),
    "sets": Source("contextual_bert.import_sets", "import_sets",
                   "curated sets (outfit id, item id) or Polyvore Outfits JSON; customers optional"),
    "planted": Source("contextual_bert.planted", "planted",
                      "planted customer signal whose exact Bayes-optimal predictor is known (optimum stage)"),
}  # fmt: skip


def ingest(cfg, source: Path | None = None) -> dict:
    """Run the source `ingest.source` names; `source` overrides the path in its params section."""
    return SOURCES[cfg.ingest.source].ingest(cfg, source)
