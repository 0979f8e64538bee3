"""Data: the sources (generated, planted, H&M, curated sets) and their contract, validation, and the features
stage (vocabulary, context tables, splits, history) with its store.

The public API is `__all__`: the names studies/ and users import from here (tests/test_studies.py). Those
from other modules are exported lazily (`contextual_bert.lazy`).
"""

from typing import TYPE_CHECKING

from contextual_bert.lazy import lazy_exports

if TYPE_CHECKING:
    from contextual_bert.data.feature_spec import (
        HISTORY_FEATURE,
        MASK_INDEX,
        N_SPECIAL,
        PAD_INDEX,
        UNKNOWN_INDEX,
        EncodedOutfits,
    )
    from contextual_bert.data.feature_store import load_article_vocab, load_catalogue, load_spec, load_split
    from contextual_bert.data.history import earlier_outfits, history_items
    from contextual_bert.data.planted.tastes import TRUTH_JSON, load_truth

_PUBLIC = {  # a lazily exported name: its module in this package
    "EncodedOutfits": "feature_spec",
    "HISTORY_FEATURE": "feature_spec",
    "MASK_INDEX": "feature_spec",
    "N_SPECIAL": "feature_spec",
    "PAD_INDEX": "feature_spec",
    "UNKNOWN_INDEX": "feature_spec",
    "load_article_vocab": "feature_store",
    "load_catalogue": "feature_store",
    "load_spec": "feature_store",
    "load_split": "feature_store",
    "earlier_outfits": "history",
    "history_items": "history",
    "TRUTH_JSON": "planted.tastes",
    "load_truth": "planted.tastes",
}
__all__ = list(_PUBLIC)

__getattr__ = lazy_exports(__name__, _PUBLIC, globals())
