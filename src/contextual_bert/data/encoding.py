"""The value encoders: raw context and attribute values -> the stored indices, one code path for the features
stage's tables and for serving (`vocabularies.ContextIndexer` applies them per feature).

Encoding rules (one code path, `ContextIndexer`, for the stored tables and for serving):
- categorical: the value as a string; vocabulary = train values seen at least `min_context_count` times,
  sorted, index = position + N_SPECIAL. None/NaN/"" -> MISSING_INDEX, anything else unseen -> UNKNOWN_INDEX.
- multi_categorical: each value encoded as above, duplicate indices dropped keeping the first, then the
  first `max_values` indices kept in the order the values were listed (the cap is deterministic and keeps
  what the data lists first). None or an empty list -> a single MISSING_INDEX, so every row has at least
  one index to pool. A plain string counts as a one-value list.
- text (article attributes only: a product's name, title or description): the text's words (`text_words`:
  accents dropped, case folded, split at anything not a letter or digit, TEXT_STOP_WORDS dropped), then
  encoded as a multi_categorical list of words (vocabulary: words on at least `min_text_count` train
  articles; an unseen word -> UNKNOWN_INDEX; the first `max_text_words` distinct words kept). No word ->
  MISSING_INDEX.
- numeric: quantile bucket edges of the train values (`numeric_buckets` buckets, tied edges merged);
  bucket b (0-based, `searchsorted(edges, x, side="right")`) -> index b + N_SPECIAL. NaN -> MISSING_INDEX,
  a value that is not a number -> UNKNOWN_INDEX.
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np
import pandas as pd

from contextual_bert.data.feature_spec import MISSING_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX

# --- encoding: the one code path for stored tables and serving -------------------------------------------

# Plain numpy and Python over object arrays, no pandas Series per feature: a one-row request pays
# microseconds per feature, and the stage's hundreds of thousands of rows stay vectorised where it counts.

LIST_LIKE = (list, tuple, np.ndarray, pd.Series)  # cells that hold several values (as pandas' explode)


SMALL_FRAME_ROWS = 64  # up to this many rows, a frame's columns are read in one conversion (column_arrays)


def column_arrays(rows: pd.DataFrame, names) -> dict[str, np.ndarray]:
    """The frame's columns among `names`, by name, as arrays (positional: the frame's index is not kept).

    Reading a pandas column builds a Series (~10 us each): on a one-row request, more than encoding it.
    A small frame is converted once into one object array instead (its cells as they are; numbers as
    Python floats, which encode_numeric reads the same); a large one column by column, keeping numeric
    columns numeric for the vectorised path."""
    if len(rows) <= SMALL_FRAME_ROWS and rows.columns.is_unique:
        return dict(zip(rows.columns, rows.to_numpy(dtype=object).T))
    return {name: rows[name].to_numpy() for name in names if name in rows.columns}


def as_object_array(values) -> np.ndarray:
    """Any column (Series, array, list) as a 1-D object array, one cell per element."""
    if isinstance(values, pd.Series):
        values = values.to_numpy()
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    return np.fromiter(values, dtype=object, count=len(values))


def text_of(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each cell as a string, missing): None/NaN/NA and "" are missing (text "")."""
    missing = np.asarray(pd.isna(cells), dtype=bool)
    text = np.fromiter(("" if m else str(v) for v, m in zip(cells, missing)), dtype=object, count=len(cells))
    return text, missing | (text == "")


def index_of(values) -> dict[str, int]:
    """A vocabulary (its values in index order, specials excluded) as value -> index."""
    return {value: position + N_SPECIAL for position, value in enumerate(values)}


def lookup(text: np.ndarray, vocab: dict[str, int]) -> np.ndarray:
    """Index of each string in the vocabulary, UNKNOWN_INDEX when absent. (A dict: pandas' get_indexer
    costs milliseconds per call on a one-row request.)"""
    get = vocab.get
    return np.fromiter((get(t, UNKNOWN_INDEX) for t in text), dtype=np.int64, count=len(text))


def encode_categorical(values, vocab: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices (N,), missing (N,), unknown (N,)) for one categorical column."""
    text, missing = text_of(as_object_array(values))
    idx = lookup(text, vocab)
    unknown = (idx == UNKNOWN_INDEX) & ~missing
    idx[missing] = MISSING_INDEX
    return idx, missing, unknown


def explode_values(values) -> tuple[np.ndarray, np.ndarray]:
    """(row of each value, the value as a string) for list-valued cells, missing and empty values dropped.

    A cell that is not list-like (a plain string) counts as a one-value list."""
    rows: list[int] = []
    flat: list = []
    for row, cell in enumerate(as_object_array(values)):
        if isinstance(cell, LIST_LIKE):
            flat.extend(cell)
            rows.extend([row] * len(cell))
        else:
            flat.append(cell)
            rows.append(row)
    text, missing = text_of(np.fromiter(flat, dtype=object, count=len(flat)))
    return np.asarray(rows, dtype=np.int64)[~missing], text[~missing]


def encode_multi(values, vocab: dict[str, int], max_values: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices (N, max_values) PAD-padded, missing (N,), unknown (N,)) for one list-valued column."""
    n = len(values)
    rows, text = explode_values(values)
    idx = lookup(text, vocab)
    unknown = np.zeros(n, dtype=bool)
    unknown[rows[idx == UNKNOWN_INDEX]] = True
    # Duplicate (row, index) pairs dropped keeping the first; rows ascend, so a row's slots are its
    # position among the kept pairs minus where the row starts.
    first = np.zeros(len(rows), dtype=bool)
    first[np.unique(rows * (len(vocab) + N_SPECIAL) + idx, return_index=True)[1]] = True
    rows, idx = rows[first], idx[first]
    slot = np.arange(len(rows)) - np.searchsorted(rows, rows, side="left")
    keep = slot < max_values
    out = np.full((n, max_values), PAD_INDEX, dtype=np.int64)
    out[rows[keep], slot[keep]] = idx[keep]
    missing = np.ones(n, dtype=bool)
    missing[rows] = False
    out[missing, 0] = MISSING_INDEX
    return out, missing, unknown


# Words too common in product text to tell articles apart (English, as H&M's and Polyvore's text is): a small
# list, on purpose; the vocabulary's minimum count drops the rare words.
TEXT_STOP_WORDS = frozenset(
    "a an and are as at be by for from has in is it its of on or that the this to with".split()
    + "without your you our we".split()
)


WORD_SPLIT = re.compile(r"[^0-9a-z]+")


def text_words(value) -> list[str]:
    """A text's words: accents dropped (NFKD, combining marks removed), case folded, split at every character
    that is not a letter or digit, stop words (TEXT_STOP_WORDS) and one-letter words dropped; in the order
    written, each once. Missing or not text -> no word. ("Slim-fit Jeans, ÉCRU" -> slim, fit, jeans, ecru.)"""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return []
    folded = unicodedata.normalize("NFKD", str(value)).casefold()
    folded = "".join(c for c in folded if not unicodedata.combining(c))
    words = [w for w in WORD_SPLIT.split(folded) if len(w) > 1 and w not in TEXT_STOP_WORDS]
    return list(dict.fromkeys(words))


def text_lists(values) -> np.ndarray:
    """Each cell's words (text_words) as an object array of lists: the multi_categorical path reads them."""
    cells = as_object_array(values)
    out = np.empty(len(cells), dtype=object)
    for i, cell in enumerate(cells):
        out[i] = text_words(cell)
    return out


def to_float(cells: np.ndarray) -> np.ndarray:
    """Numbers and numeric strings as float64; anything else (words, lists, true/false) NaN."""
    out = np.full(len(cells), np.nan)
    for i, cell in enumerate(cells):
        if isinstance(cell, (int, float, np.number)) and not isinstance(cell, (bool, np.bool_)):
            out[i] = float(cell)
        elif isinstance(cell, str):
            try:
                out[i] = float(cell)
            except ValueError:
                pass
    return out


def encode_numeric(values, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bucket indices (N,), missing (N,), unknown (N,)) for one numeric column."""
    array = values.to_numpy() if isinstance(values, pd.Series) else np.asarray(values)
    if array.dtype.kind in "iuf":  # a numeric column (the stage's tables): NaN is missing
        number = array.astype(np.float64)
        missing = np.isnan(number)
    else:
        cells = as_object_array(values)
        _, missing = text_of(cells)
        number = to_float(cells)
    unknown = ~np.isfinite(number) & ~missing  # a word, or infinity: no measurement
    idx = (np.searchsorted(edges, number, side="right") + N_SPECIAL).astype(np.int64)
    idx[missing] = MISSING_INDEX
    idx[unknown] = UNKNOWN_INDEX
    return idx, missing, unknown
