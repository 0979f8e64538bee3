"""The `planted` source (sources.SOURCES): planted data whose exact optimum is known, in one of two stories.

planted.closet_size 0 (the default): planted tastes (data/planted/tastes.py); above 0: planted closets, of large
catalogues and customers who wear their own articles again (data/planted/closets.py). Both write the same raw
contract and a truth file; this module picks the story when writing and tells the two truths apart when reading.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from contextual_bert.config import IngestConfig, ModelConfig, PlantedConfig
from contextual_bert.data.contract import DataSchema
from contextual_bert.data.planted import closets, tastes
from contextual_bert.errors import DataError


def generate(
    cfg: PlantedConfig,
    out_dir: Path,
    max_set_size: int = ModelConfig().max_set_size,
    min_set_size: int = IngestConfig().min_set_size,
) -> dict:
    """Write the raw contract and the truth of the story cfg names into out_dir; the ingest report."""
    story = closets.generate_closets if cfg.closet_size else tastes.generate_planted
    return story(cfg, Path(out_dir), max_set_size, min_set_size)


def ingest(cfg, source=None) -> dict:
    """The `planted` entry of sources.SOURCES (it reads no files: `source` is unused)."""
    return generate(
        cfg.planted,
        out_dir=cfg.paths.raw_dir,
        max_set_size=cfg.model.max_set_size,
        min_set_size=cfg.ingest.min_set_size,
    )


def schema(cfg) -> DataSchema:
    """The context columns of the story planted.closet_size names (and of the planted tastes' options)."""
    return closets.closet_schema() if cfg.planted.closet_size else tastes.planted_schema(cfg.planted)


def inputs(cfg) -> list:
    """The files the `planted` source reads: none."""
    return []


def truth_exists(raw_dir: Path) -> bool:
    return (Path(raw_dir) / tastes.TRUTH_FILE).is_file()


def load_truth(raw_dir: Path):
    """The truth in raw_dir: a tastes.PlantedTruth, or a closets.ClosetTruth for the closets' story."""
    path = Path(raw_dir) / tastes.TRUTH_FILE
    if not path.is_file():
        raise DataError("no planted truth here: the data was not made by `contextual-bert generate-planted`", path=path)
    try:
        with np.load(path, allow_pickle=False) as z:
            if closets.CLOSET_KEY in z.files:
                return closets.truth_from_npz(z, path)
    except (KeyError, ValueError, OSError) as exc:
        raise DataError(f"not a readable planted truth file ({exc})", path=path) from None
    return tastes.load_truth(raw_dir)
