"""Guards before training: every split must hold enough outfits and enough known targets.

A target is an outfit's article, masked in turn; it is known when the article is in the train vocabulary
(seen at least `min_article_count` times in the train split). A validation split without known targets
gives an infinite or undefined validation loss, a test split without them no metric at all: the features
stage stops with one line saying what is short and what to change, before any training runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from contextual_bert.config import FeaturesConfig
from contextual_bert.errors import ContextualBertError

FRACTION_KEY = {"val": "val_fraction", "test": "test_fraction"}


def split_counts(split: np.ndarray, item_split: np.ndarray, item_known: np.ndarray, splits) -> dict:
    """Per split: outfits and known targets (its items in the train vocabulary)."""
    return {name: {"outfits": int((split == name).sum()), "known_targets": int(item_known[item_split == name].sum())}
            for name in splits}  # fmt: skip


def check_splits(counts: dict, cfg: FeaturesConfig, path: Path) -> None:
    """Raise a one-line ContextualBertError for the first split below features.min_split_outfits or
    features.min_known_targets."""
    for name, count in counts.items():
        short = []
        if count["outfits"] < cfg.min_split_outfits:
            short.append(f"{count['outfits']} outfits (features.min_split_outfits={cfg.min_split_outfits})")
        if count["known_targets"] < cfg.min_known_targets:
            short.append(f"{count['known_targets']} known targets, i.e. articles also in the train vocabulary "
                         f"(features.min_known_targets={cfg.min_known_targets})")  # fmt: skip
        if not short:
            continue
        total = sum(c["outfits"] for c in counts.values())
        if name == "train":
            fix = (f"add outfits or lower features.val_fraction ({cfg.val_fraction}) and test_fraction "
                   f"({cfg.test_fraction})")  # fmt: skip
        else:
            fix = f"add outfits or raise features.{FRACTION_KEY[name]} ({getattr(cfg, FRACTION_KEY[name])})"
        if count["outfits"] and count["known_targets"] < cfg.min_known_targets:
            fix += f", or lower features.min_article_count ({cfg.min_article_count})"
        raise ContextualBertError(f"{path}: the {name} split has only {' and '.join(short)} of {total} outfits; {fix}")
