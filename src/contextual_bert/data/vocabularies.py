"""The vocabularies the features stage fitted: the context features' (`ContextIndexer`, which encodes raw
context by them), the articles' (`ArticleVocab`), and the catalogue of every article with its encoded attributes
(`Catalogue`). `feature_store.py` loads them from data/features."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from contextual_bert.data.encoding import (
    as_object_array,
    column_arrays,
    encode_categorical,
    encode_multi,
    encode_numeric,
    index_of,
    lookup,
    text_lists,
)
from contextual_bert.data.feature_spec import N_SPECIAL, UNKNOWN_INDEX, VECTOR_KIND, ContextSpec, FeatureSpec
from contextual_bert.data.vectors import TextVectors, check_vectors, encode_vector
from contextual_bert.errors import ContextualBertError


class ContextIndexer:
    """Raw context values -> index tensors, exactly as the features stage stored them for training (an article
    vector: its float row, vectors.encode_vector).

    `derived`: the vector attributes made from the articles' text (features.derived_vectors), by name: their
    vectors come from those columns (vectors.TextVectors), not from a column of their own."""

    def __init__(self, spec: ContextSpec, vocab: dict[str, dict], derived: dict[str, TextVectors] | None = None):
        self.spec = spec
        self.vocab = vocab
        self.derived = derived or {}
        self._index = {name: index_of(v["values"]) for name, v in vocab.items() if "values" in v}
        self._edges = {
            name: np.asarray(v["bucket_edges"], dtype=np.float64) for name, v in vocab.items() if "bucket_edges" in v
        }

    def encode_feature(self, feature: FeatureSpec, values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indices, missing, unknown) of one feature's raw values."""
        if feature.kind == "categorical":
            return encode_categorical(values, self._index[feature.name])
        if feature.kind == "multi_categorical":
            return encode_multi(values, self._index[feature.name], feature.max_values)
        if feature.kind == "text":
            return encode_multi(text_lists(values), self._index[feature.name], feature.max_values)
        if feature.kind == VECTOR_KIND:
            return encode_vector(values, self.vocab[feature.name])
        return encode_numeric(values, self._edges[feature.name])

    def encode_arrays(self, rows, source: str | None = None, n_rows: int | None = None):
        """Numpy (indices, missing, unknown) dicts for every feature of `source` (all when None).

        `rows`: a frame, or its columns by name (`column_arrays`; then `n_rows` says how many rows).
        A feature whose column is absent from `rows` is missing on every row.
        """
        indices, missing, unknown = {}, {}, {}
        n = len(rows) if n_rows is None else n_rows
        for feature in self.spec.features:
            if (source is not None and feature.source != source) or feature.source == "history":
                continue  # the history holds article ids: OutfitEncoder reads it through the article vocabulary
            if feature.name in rows:
                column = rows[feature.name]
            elif feature.name in self.derived:
                column = self.derived[feature.name].transform(rows)
            else:
                column = np.full(n, None, dtype=object)
            name = feature.name
            indices[name], missing[name], unknown[name] = self.encode_feature(feature, column)
        return indices, missing, unknown

    def encode(self, rows: pd.DataFrame) -> tuple[dict[str, torch.Tensor], list[dict]]:
        """Index tensors for every context feature, and per row the features that were missing or unknown."""
        columns = column_arrays(rows, [f.name for f in self.spec.features])
        tensors, missing, unknown = self.encode_columns(columns, len(rows))
        return tensors, [{"missing": m, "unknown": u} for m, u in zip(missing, unknown)]

    def encode_columns(self, columns: dict[str, np.ndarray], n_rows: int):
        """`encode` of a frame's columns by name (`column_arrays`): (index tensors, per row the names of the
        features that were missing, per row those that held an unseen value)."""
        indices, missing, unknown = self.encode_arrays(columns, n_rows=n_rows)
        tensors = {name: torch.from_numpy(a) for name, a in indices.items()}
        return tensors, _names_per_row(missing, n_rows), _names_per_row(unknown, n_rows)


def _names_per_row(flags: dict[str, np.ndarray], n: int) -> list[list[str]]:
    """Per row, the names whose flag is set, in the dict's order: a Python step per set flag only (most
    rows have none), not per row and name."""
    out: list[list[str]] = [[] for _ in range(n)]
    if flags:
        rows, columns = np.nonzero(np.stack(list(flags.values()), axis=1))
        names = list(flags)
        for row, column in zip(rows.tolist(), columns.tolist()):
            out[row].append(names[column])
    return out


# --- the article vocabulary ------------------------------------------------------------------------------


WHOLE_NUMBER = re.compile(r"(\d+)(?:\.0*)?", re.ASCII)


@dataclass(frozen=True)
class ArticleVocab:
    """Article ids by index ([PAD], [MASK], [UNK] first) and their occurrence counts in the train split."""

    ids: list[str]
    counts: np.ndarray

    @cached_property
    def _index(self) -> dict[str, int]:
        """Index of each real article id (the specials have none)."""
        return index_of(self.ids[N_SPECIAL:])

    def __len__(self) -> int:
        return len(self.ids)

    def to_indices(self, article_ids, as_written: bool = True) -> tuple[np.ndarray, list[str]]:
        """(int64 indices, the ids not in the vocabulary); those map to UNKNOWN_INDEX. With as_written=False
        (ids a client typed) an id the vocabulary lacks as written is looked up again without surrounding
        spaces and, when it is a whole number, by its value, where exactly one id has that value: 108775015,
        '108775015' and '108775015.0' find '0108775015' (integer columns and spreadsheets drop leading zeros)."""
        cells = as_object_array(article_ids)
        ids = np.fromiter((str(a) for a in cells), dtype=object, count=len(cells))
        idx = lookup(ids, self._index)
        if not as_written:
            for position in np.flatnonzero(idx == UNKNOWN_INDEX).tolist():
                text = ids[position].strip()
                whole = WHOLE_NUMBER.fullmatch(text)
                idx[position] = self._index.get(text) or (self._by_number.get(int(whole[1])) if whole else None) \
                    or UNKNOWN_INDEX  # fmt: skip
        return idx, ids[idx == UNKNOWN_INDEX].tolist()

    @cached_property
    def _by_number(self) -> dict[int, int]:
        """Index of each id written as a whole number, by its value; a value two ids share ('7', '07') is left out."""
        numbers = {i: int(a) for i, a in enumerate(self.ids[N_SPECIAL:], N_SPECIAL) if a.isascii() and a.isdigit()}
        shared = Counter(numbers.values())
        return {value: i for i, value in numbers.items() if shared[value] == 1}

    def to_ids(self, indices) -> list[str]:
        if isinstance(indices, torch.Tensor):
            indices = indices.tolist()
        return [self.ids[int(i)] for i in np.asarray(indices).ravel()]


# --- the catalogue: every article, known by its attributes -----------------------------------------------


@dataclass(frozen=True)
class Catalogue:
    """Every article the attribute models ("<model>_attrs") score, with its encoded attributes.

    Indices 0..n_ids-1 are the train article vocabulary, in its order (specials first): these articles
    have an id embedding. The other articles of the articles table follow (sorted by id), and articles
    added later (`extend`, at serving) after them: they have no id embedding and read the [UNK] id row.
    `attributes`: attribute name -> (n,) or (n, max_values) int64 indices, the special rows PAD (a zero
    attribute vector); or, for a vector, (n, length) float32, a NaN row for an article without one (the specials
    too). The attributes are encoded by `indexer` (the context features' code, `ContextIndexer`): missing -> its
    reserved missing row (a vector: the model's missing vector), a value not fitted -> UNKNOWN_INDEX; no article
    is ever dropped.
    """

    vocab: ArticleVocab  # ids and train occurrences of every catalogue article (0: never in a train outfit)
    n_ids: int
    attributes: dict[str, np.ndarray]
    indexer: ContextIndexer

    @property
    def spec(self) -> ContextSpec:
        return self.indexer.spec

    def __len__(self) -> int:
        return len(self.vocab)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in self.attributes.items()}

    def encode(self, articles: pd.DataFrame) -> dict[str, np.ndarray]:
        """Raw attribute columns of `articles` -> encoded index arrays (an absent column: missing)."""
        indices, _, _ = self.indexer.encode_arrays(articles.reset_index(drop=True), source="article")
        return indices

    def extend(self, articles: pd.DataFrame, path: Path | None = None) -> Catalogue:
        """The catalogue with the articles of `articles` (column article_id + raw attribute columns) that it
        does not hold yet appended, without an id embedding. Articles it holds keep their row. A bad vector
        in the table (`path`, for the message) is a one-line error naming its row and column."""
        if "article_id" not in articles.columns:
            raise ContextualBertError("the catalogue table has no 'article_id' column")
        ids = articles["article_id"].astype(str)
        for f in self.spec.features:
            if f.kind == VECTOR_KIND and f.name in articles.columns:
                check_vectors(articles[f.name], ids.to_numpy(), path, f.name, length=f.max_values)
        new = articles[~ids.isin(set(self.vocab.ids)).to_numpy() & ~ids.duplicated().to_numpy()]
        if not len(new):
            return self
        encoded = self.encode(new)
        attributes = {name: np.concatenate([a, encoded[name]]) for name, a in self.attributes.items()}
        vocab = ArticleVocab(
            self.vocab.ids + new["article_id"].astype(str).tolist(),
            np.concatenate([self.vocab.counts, np.zeros(len(new), dtype=np.int64)]),
        )
        return Catalogue(vocab, self.n_ids, attributes, self.indexer)
