"""The one outfit encoder: raw outfits (lists of article ids) with their context -> model tensors, through one
model's vocabularies. Serving's requests and promotion's re-encoded outfits go through it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from contextual_bert.data.encoding import LIST_LIKE, column_arrays
from contextual_bert.data.feature_spec import (
    HISTORY_COLUMN,
    MASK_INDEX,
    PAD_INDEX,
    UNKNOWN_INDEX,
    EncodedOutfits,
    FeatureSpec,
)
from contextual_bert.data.feature_store import load_article_vocab, load_context_indexer
from contextual_bert.data.history import listed_history
from contextual_bert.data.vocabularies import ArticleVocab, ContextIndexer
from contextual_bert.errors import ContextualBertError

# --- the one outfit encoder: raw outfits + context -> model tensors ----------------------------------------


def _is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def outfit_ids_of(value, row: int, max_items: int, what: str = "an outfit") -> list[str]:
    """One row's outfit as a list of id strings, or a one-line error naming the row."""
    if isinstance(value, LIST_LIKE):
        ids = list(value)
    elif _is_missing(value):
        ids = []
    else:
        raise ContextualBertError(
            f"row {row}: 'article_ids' must be a list of article ids, got {type(value).__name__} {value!r:.60}"
        )
    if not ids:
        raise ContextualBertError(f"row {row}: 'article_ids' is empty; give the partial outfit, 1 to {max_items} ids")
    if len(ids) > max_items:
        raise ContextualBertError(f"row {row}: 'article_ids' has {len(ids)} ids; {what} has at most {max_items}")
    out = []
    for item in ids:
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (str, int, np.integer)) or item == "":
            raise ContextualBertError(f"row {row}: 'article_ids' holds {item!r:.60}, not an article id")
        out.append(str(item))
    if len(set(out)) < len(out):
        seen = set()
        for item in out:
            if item in seen:
                raise ContextualBertError(f"row {row}: article id '{item}' appears twice in 'article_ids'")
            seen.add(item)
    return out


@dataclass
class EncodedRows:
    """Raw rows as the model reads them, and what the encoding could not use, per row."""

    outfits: EncodedOutfits
    unknown_article_ids: list[list[str]]
    missing_features: list[list[str]]
    unknown_features: list[list[str]]


class OutfitEncoder:
    """Raw outfits (column `article_ids`, lists of ids) with their context columns -> model tensors, through
    one model's article vocabulary and context vocabularies.

    The one path from raw rows to a model's input: serving requests (partial outfits, `with_mask`: a
    [MASK] after the last item, the slot to predict) and whole outfits re-encoded from data/validated for
    a model trained on other features (promotion). Vectorised over rows: the per-row work is checking the
    ids."""

    def __init__(self, article_vocab: ArticleVocab, context: ContextIndexer, max_set_size: int):
        self.article_vocab = article_vocab
        self.context = context
        self.max_set_size = max_set_size

    @classmethod
    def load(cls, features_dir: Path, max_set_size: int) -> OutfitEncoder:
        return cls(load_article_vocab(features_dir), load_context_indexer(features_dir), max_set_size)

    def encode(
        self, rows: pd.DataFrame, with_mask: bool, id_column: str | None = None, as_written: bool = False
    ) -> EncodedRows:
        """`as_written`: match article ids exactly, as for data (default: leniently, as typed by a client;
        ArticleVocab.to_indices)."""
        if "article_ids" not in rows.columns:
            raise ContextualBertError("the request has no 'article_ids' column (the partial outfit of each row)")
        needed = [
            "article_ids",
            *(f.name for f in self.context.spec.features if f.source != "history"),
            *([id_column] if id_column else []),
        ]
        n_rows, columns = len(rows), column_arrays(rows, needed)  # each column read once, by position
        max_items = self.max_set_size - 1 if with_mask else self.max_set_size
        what = "an outfit to complete" if with_mask else "an outfit"
        outfits = [outfit_ids_of(v, i, max_items, what) for i, v in enumerate(columns["article_ids"].tolist())]
        lengths = np.fromiter((len(ids) for ids in outfits), dtype=np.int64, count=len(outfits))
        flat = [a for ids in outfits for a in ids]
        indices, _ = self.article_vocab.to_indices(flat, as_written)  # one lookup for the whole batch
        rows_of = np.repeat(np.arange(len(outfits)), lengths)
        known = indices != UNKNOWN_INDEX
        # one (row, article) key each: np.unique over columns of a 2-row array is 10x slower (numpy 2.4)
        _, first = np.unique(rows_of[known] * len(self.article_vocab.ids) + indices[known], return_index=True)
        if len(first) < known.sum():  # two spellings of one article ('0108775015', 108775015)
            twice = np.setdiff1d(np.arange(known.sum()), first)[0]
            row, spelled = rows_of[known][twice], np.asarray(flat, dtype=object)[known][twice]
            raise ContextualBertError(
                f"row {row}: article id '{spelled}' appears twice in 'article_ids' "
                f"(as '{self.article_vocab.ids[indices[known][twice]]}')"
            )
        slots = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        items = np.full((n_rows, self.max_set_size), PAD_INDEX, dtype=np.int64)
        items[rows_of, slots] = indices
        if with_mask:
            items[np.arange(len(outfits)), lengths] = MASK_INDEX
        unknown_ids: list[list[str]] = [[] for _ in outfits]
        for position in np.flatnonzero(indices == UNKNOWN_INDEX).tolist():
            unknown_ids[rows_of[position]].append(flat[position])
        context, missing, unknown = self.context.encode_columns(columns, n_rows)
        history = next((f for f in self.context.spec.features if f.source == "history"), None)
        if history is not None:
            context[history.name] = self._history(rows, history, as_written, missing, unknown_ids)
        ids = [str(v) for v in columns[id_column].tolist()] if id_column else None
        return EncodedRows(EncodedOutfits(torch.from_numpy(items), context, ids), unknown_ids, missing, unknown)

    def _history(
        self,
        rows: pd.DataFrame,
        feature: FeatureSpec,
        as_written: bool,
        missing: list[list[str]],
        unknown_ids: list[list[str]],
    ) -> torch.Tensor:
        """(N, max_values) article indices of each row's HISTORY_COLUMN, as the client lists them (each earlier
        outfit's articles, the most recent outfit first) laid out as the features stage lays out a history
        (history.listed_history: once per outfit that held it, the most worn first); absent or empty: no
        history, reported in `missing`; ids the model does not know are reported in `unknown_ids` beside the
        outfit's."""
        width = feature.max_values
        out = np.full((len(rows), width), PAD_INDEX, dtype=np.int64)
        values = rows[HISTORY_COLUMN].tolist() if HISTORY_COLUMN in rows.columns else [None] * len(rows)
        for row, value in enumerate(values):
            if _is_missing(value) or (isinstance(value, LIST_LIKE) and len(value) == 0):
                missing[row].append(feature.name)
                continue
            if not isinstance(value, LIST_LIKE):
                raise ContextualBertError(
                    f"row {row}: '{HISTORY_COLUMN}' must be a list of article ids, got "
                    f"{type(value).__name__} {value!r:.60}"
                )
            ids = listed_history([str(v) for v in value if not _is_missing(v) and str(v) != ""], width)
            indices, _ = self.article_vocab.to_indices(ids, as_written)
            out[row, : len(indices)] = indices
            unknown_ids[row].extend(dict.fromkeys(i for i, k in zip(ids, indices) if k == UNKNOWN_INDEX))
        return torch.from_numpy(out)
