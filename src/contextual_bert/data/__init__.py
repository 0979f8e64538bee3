"""Data: the sources (generated, planted, H&M, curated sets) and their contract, validation, and the features
stage (vocabulary, context tables, splits, history) with its store.

The public API is `__all__`: the names studies/ and users import from here (tests/test_studies.py). Those
from other modules are exported lazily (`contextual_bert.lazy`).
"""

from typing import TYPE_CHECKING

from contextual_bert.lazy import lazy_exports

if TYPE_CHECKING:
    from contextual_bert.data.contract import DATE_COLUMN, PAPER_SCHEMA
    from contextual_bert.data.feature_spec import (
        HISTORY_COLUMN,
        HISTORY_FEATURE,
        MASK_INDEX,
        N_SPECIAL,
        PAD_INDEX,
        UNKNOWN_INDEX,
        ContextSpec,
        EncodedOutfits,
        FeatureSpec,
    )
    from contextual_bert.data.feature_store import load_article_vocab, load_catalogue, load_spec, load_split
    from contextual_bert.data.features import build_features
    from contextual_bert.data.history import earlier_outfits, history_items
    from contextual_bert.data.planted.tastes import TRUTH_JSON, load_truth
    from contextual_bert.data.sources.hm import import_hm
    from contextual_bert.data.sources.sets import import_sets
    from contextual_bert.data.sources.synthetic import generate
    from contextual_bert.data.validation import validate

_PUBLIC = {  # a lazily exported name: its module in this package
    "DATE_COLUMN": "contract",
    "PAPER_SCHEMA": "contract",
    "ContextSpec": "feature_spec",
    "EncodedOutfits": "feature_spec",
    "FeatureSpec": "feature_spec",
    "HISTORY_COLUMN": "feature_spec",
    "HISTORY_FEATURE": "feature_spec",
    "MASK_INDEX": "feature_spec",
    "N_SPECIAL": "feature_spec",
    "PAD_INDEX": "feature_spec",
    "UNKNOWN_INDEX": "feature_spec",
    "load_article_vocab": "feature_store",
    "load_catalogue": "feature_store",
    "load_spec": "feature_store",
    "load_split": "feature_store",
    "build_features": "features",
    "earlier_outfits": "history",
    "history_items": "history",
    "TRUTH_JSON": "planted.tastes",
    "load_truth": "planted.tastes",
    "import_hm": "sources.hm",
    "import_sets": "sources.sets",
    "generate": "sources.synthetic",
    "validate": "validation",
}
__all__ = list(_PUBLIC)

__getattr__ = lazy_exports(__name__, _PUBLIC, globals())
