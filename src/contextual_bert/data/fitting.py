"""Fitting a feature's vocabulary on data: categorical values, multi-valued ones, a text's words, numeric bucket
edges. The one fitting code of the context features (fitted on the train rows, features.py) and of the article
attributes (on the train vocabulary's articles, catalogue.py); `encoding.py` encodes by what it fits."""

from __future__ import annotations

import numpy as np
import pandas as pd

from contextual_bert.config import FeaturesConfig
from contextual_bert.data.encoding import as_object_array, explode_values, text_lists, text_of, to_float
from contextual_bert.data.feature_spec import N_SPECIAL, FeatureKind, FeatureSource, FeatureSpec


def fit_categorical(values, min_count: int) -> list[str]:
    text, missing = text_of(as_object_array(values))
    counts = pd.Series(text[~missing], dtype=object).value_counts()
    return sorted(counts.index[counts >= min_count].tolist())


def fit_multi(values, min_count: int) -> tuple[list[str], int]:
    """(vocabulary, the longest list of distinct values in a row)."""
    rows, text = explode_values(values)
    pairs = pd.DataFrame({"row": rows, "value": text}).drop_duplicates()
    counts = pairs["value"].value_counts()
    longest = int(pairs.groupby("row").size().max()) if len(pairs) else 1
    return sorted(counts.index[counts >= min_count].tolist()), longest


def fit_numeric(values, n_buckets: int) -> list[float]:
    array = values.to_numpy() if isinstance(values, pd.Series) else np.asarray(values)
    number = array.astype(np.float64) if array.dtype.kind in "iuf" else to_float(as_object_array(values))
    number = number[np.isfinite(number)]
    if len(number) == 0:
        return []
    return np.unique(np.quantile(number, np.linspace(0, 1, n_buckets + 1)[1:-1])).tolist()


def fit_feature(
    name: str, kind: FeatureKind, source: FeatureSource, values, cfg: FeaturesConfig, dim: int, min_count: int
) -> tuple[FeatureSpec, dict]:
    """One feature's spec and vocabulary entry (values or bucket edges), fitted on `values`: the one fitting
    code of context features and article attributes."""
    max_values = 1
    if kind == "text":  # its words, as a list of values (encoding.text_words)
        values_seen, longest = fit_multi(text_lists(values), cfg.min_text_count)
        max_values = min(cfg.max_text_words, longest)
        entry: dict[str, object] = {"kind": kind, "source": source, "values": values_seen, "max_values": max_values}
        return FeatureSpec(name, kind, source, N_SPECIAL + len(values_seen), dim, max_values), entry
    if kind == "numeric":
        edges = fit_numeric(values, cfg.numeric_buckets)
        entry = {"kind": kind, "source": source, "bucket_edges": edges}
        cardinality = N_SPECIAL + len(edges) + 1
    else:
        if kind == "multi_categorical":
            values_seen, longest = fit_multi(values, min_count)
            max_values = min(cfg.max_multi_values, longest)
        else:
            values_seen = fit_categorical(values, min_count)
        entry = {"kind": kind, "source": source, "values": values_seen}
        cardinality = N_SPECIAL + len(values_seen)
    if kind == "multi_categorical":
        entry["max_values"] = max_values
    return FeatureSpec(name, kind, source, cardinality, dim, max_values), entry
