"""The feature store: what the features stage wrote to data/features, and how everyone reads it.

File names, the encoders that turn raw values into the stored indices, and the loaders. Training,
evaluation, tracking, the registry and serving read data/features only through this module; the stage
that writes it is `features.py`.

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

import hashlib
import json
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from contextual_bert.errors import ContextualBertError, DataError
from contextual_bert.data.history import listed_history
from contextual_bert.data.feature_spec import (
    MASK_INDEX,
    MISSING_INDEX,
    N_SPECIAL,
    PAD_INDEX,
    UNKNOWN_INDEX,
    ContextSpec,
    HISTORY_COLUMN,
    EncodedOutfits,
    FeatureSpec,
)

SPLITS = ("train", "val", "test")
SPECIAL_ARTICLES = ("[PAD]", "[MASK]", "[UNK]")
ARTICLE_VOCAB_FILE = "article_vocab.parquet"
CONTEXT_VOCAB_FILE = "context_vocab.json"
CUSTOMERS_FILE = "customers.parquet"
OUTFITS_FILE = "outfits.parquet"
SPEC_FILE = "spec.json"
MANIFEST_FILE = "manifest.json"
# With features.article_features on: every article of the catalogue with its encoded attributes, and the
# attributes' spec and vocabularies (to encode articles added to the catalogue later, at serving).
CATALOGUE_FILE = "catalogue.parquet"
ATTRIBUTES_FILE = "article_attributes.json"
# What a trained model needs besides its checkpoint to read requests (logged with each run, bundled with
# each served model): its vocabularies, the spec, and the manifest for lineage; and the catalogue files
# where the features stage wrote them.
MODEL_FEATURE_FILES = (ARTICLE_VOCAB_FILE, CONTEXT_VOCAB_FILE, SPEC_FILE, MANIFEST_FILE)
CATALOGUE_FEATURE_FILES = (CATALOGUE_FILE, ATTRIBUTES_FILE)


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


def _lookup(text: np.ndarray, vocab: dict[str, int]) -> np.ndarray:
    """Index of each string in the vocabulary, UNKNOWN_INDEX when absent. (A dict: pandas' get_indexer
    costs milliseconds per call on a one-row request.)"""
    get = vocab.get
    return np.fromiter((get(t, UNKNOWN_INDEX) for t in text), dtype=np.int64, count=len(text))


def encode_categorical(values, vocab: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices (N,), missing (N,), unknown (N,)) for one categorical column."""
    text, missing = text_of(as_object_array(values))
    idx = _lookup(text, vocab)
    unknown = (idx == UNKNOWN_INDEX) & ~missing
    idx[missing] = MISSING_INDEX
    return idx, missing, unknown


def explode_values(values) -> tuple[np.ndarray, np.ndarray]:
    """(row of each value, the value as a string) for list-valued cells, missing and empty values dropped.

    A cell that is not list-like (a plain string) counts as a one-value list."""
    rows, flat = [], []
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
    idx = _lookup(text, vocab)
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
    + "without your you our we".split())
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


class ContextIndexer:
    """Raw context values -> index tensors, exactly as the features stage stored them for training."""

    def __init__(self, spec: ContextSpec, vocab: dict[str, dict]):
        self.spec = spec
        self.vocab = vocab
        self._index = {name: index_of(v["values"]) for name, v in vocab.items() if "values" in v}
        self._edges = {name: np.asarray(v["bucket_edges"], dtype=np.float64) for name, v in vocab.items()
                       if "bucket_edges" in v}

    @classmethod
    def load(cls, features_dir: Path) -> "ContextIndexer":
        features_dir = Path(features_dir)
        path = _require(features_dir / CONTEXT_VOCAB_FILE)
        return cls(load_spec(features_dir), json.loads(path.read_text()))

    def encode_feature(self, feature: FeatureSpec, values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indices, missing, unknown) of one feature's raw values."""
        if feature.kind == "categorical":
            return encode_categorical(values, self._index[feature.name])
        if feature.kind == "multi_categorical":
            return encode_multi(values, self._index[feature.name], feature.max_values)
        if feature.kind == "text":
            return encode_multi(text_lists(values), self._index[feature.name], feature.max_values)
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
            column = rows[feature.name] if feature.name in rows else np.full(n, None, dtype=object)
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
    out = [[] for _ in range(n)]
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

    def __post_init__(self):
        object.__setattr__(self, "_index", index_of(self.ids[N_SPECIAL:]))

    def __len__(self) -> int:
        return len(self.ids)

    def to_indices(self, article_ids, as_written: bool = True) -> tuple[np.ndarray, list[str]]:
        """(int64 indices, the ids not in the vocabulary); those map to UNKNOWN_INDEX. With as_written=False
        (ids a client typed) an id the vocabulary lacks as written is looked up again without surrounding
        spaces and, when it is a whole number, by its value, where exactly one id has that value: 108775015,
        '108775015' and '108775015.0' find '0108775015' (integer columns and spreadsheets drop leading zeros)."""
        cells = as_object_array(article_ids)
        ids = np.fromiter((str(a) for a in cells), dtype=object, count=len(cells))
        idx = _lookup(ids, self._index)
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


def load_article_vocab(features_dir: Path) -> ArticleVocab:
    table = pd.read_parquet(_require(Path(features_dir) / ARTICLE_VOCAB_FILE)).sort_values("index")
    return ArticleVocab(table["article_id"].astype(str).tolist(), table["count"].to_numpy(dtype=np.int64))


# --- the catalogue: every article, known by its attributes -----------------------------------------------


@dataclass(frozen=True)
class Catalogue:
    """Every article the attribute models ("<model>_attrs") score, with its encoded attributes.

    Indices 0..n_ids-1 are the train article vocabulary, in its order (specials first): these articles
    have an id embedding. The other articles of the articles table follow (sorted by id), and articles
    added later (`extend`, at serving) after them: they have no id embedding and read the [UNK] id row.
    `attributes`: attribute name -> (n,) or (n, max_values) int64 indices; the special rows are PAD (a zero
    attribute vector). The attributes are encoded by `indexer` (the context features' code, `ContextIndexer`):
    missing -> its reserved missing row, a value not fitted -> UNKNOWN_INDEX; no article is ever dropped.
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

    def extend(self, articles: pd.DataFrame) -> "Catalogue":
        """The catalogue with the articles of `articles` (column article_id + raw attribute columns) that it
        does not hold yet appended, without an id embedding. Articles it holds keep their row."""
        if "article_id" not in articles.columns:
            raise ContextualBertError("the catalogue table has no 'article_id' column")
        ids = articles["article_id"].astype(str)
        new = articles[~ids.isin(set(self.vocab.ids)).to_numpy() & ~ids.duplicated().to_numpy()]
        if not len(new):
            return self
        encoded = self.encode(new)
        attributes = {name: np.concatenate([a, encoded[name]]) for name, a in self.attributes.items()}
        vocab = ArticleVocab(self.vocab.ids + new["article_id"].astype(str).tolist(),
                             np.concatenate([self.vocab.counts, np.zeros(len(new), dtype=np.int64)]))
        return Catalogue(vocab, self.n_ids, attributes, self.indexer)


def load_catalogue(features_dir: Path) -> Catalogue:
    """The catalogue the features stage wrote (features.article_features on), or a one-line error."""
    features_dir = Path(features_dir)
    attributes_path = features_dir / ATTRIBUTES_FILE
    if not attributes_path.exists():
        raise DataError("not found: the article attributes are off; set features.article_features: true and "
                        "run `contextual-bert features`", path=attributes_path)
    saved = json.loads(attributes_path.read_text())
    spec = ContextSpec.from_json(json.dumps({"features": saved["spec"]}))
    path = _require(features_dir / CATALOGUE_FILE)
    table = pq.read_table(path)
    order = np.argsort(_column(table, "index", path).to_numpy())
    table = table.take(pa.array(order))
    vocab = ArticleVocab([str(a) for a in table.column("article_id").to_pylist()],
                         table.column("count").to_numpy().astype(np.int64))
    attributes = {f.name: _feature_array(table, f, path) for f in spec.features}
    return Catalogue(vocab, int(saved["n_ids"]), attributes, ContextIndexer(spec, saved["vocab"]))


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
    def load(cls, features_dir: Path, max_set_size: int) -> "OutfitEncoder":
        return cls(load_article_vocab(features_dir), ContextIndexer.load(features_dir), max_set_size)

    def encode(self, rows: pd.DataFrame, with_mask: bool, id_column: str | None = None,
               as_written: bool = False) -> EncodedRows:
        """`as_written`: match article ids exactly, as for data (default: leniently, as typed by a client;
        ArticleVocab.to_indices)."""
        if "article_ids" not in rows.columns:
            raise ContextualBertError("the request has no 'article_ids' column (the partial outfit of each row)")
        needed = ["article_ids", *(f.name for f in self.context.spec.features if f.source != "history"),
                  *([id_column] if id_column else [])]
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
            raise ContextualBertError(f"row {row}: article id '{spelled}' appears twice in 'article_ids' "
                                      f"(as '{self.article_vocab.ids[indices[known][twice]]}')")
        slots = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        items = np.full((n_rows, self.max_set_size), PAD_INDEX, dtype=np.int64)
        items[rows_of, slots] = indices
        if with_mask:
            items[np.arange(len(outfits)), lengths] = MASK_INDEX
        unknown_ids = [[] for _ in outfits]
        for position in np.flatnonzero(indices == UNKNOWN_INDEX).tolist():
            unknown_ids[rows_of[position]].append(flat[position])
        context, missing, unknown = self.context.encode_columns(columns, n_rows)
        history = next((f for f in self.context.spec.features if f.source == "history"), None)
        if history is not None:
            context[history.name] = self._history(rows, history, as_written, missing, unknown_ids)
        ids = [str(v) for v in columns[id_column].tolist()] if id_column else None
        return EncodedRows(EncodedOutfits(torch.from_numpy(items), context, ids), unknown_ids, missing, unknown)


    def _history(self, rows: pd.DataFrame, feature: FeatureSpec, as_written: bool, missing: list[list[str]],
                 unknown_ids: list[list[str]]) -> torch.Tensor:
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
                raise ContextualBertError(f"row {row}: '{HISTORY_COLUMN}' must be a list of article ids, got "
                                          f"{type(value).__name__} {value!r:.60}")
            ids = listed_history([str(v) for v in value if not _is_missing(v) and str(v) != ""], width)
            indices, _ = self.article_vocab.to_indices(ids, as_written)
            out[row, : len(indices)] = indices
            unknown_ids[row].extend(dict.fromkeys(i for i, k in zip(ids, indices) if k == UNKNOWN_INDEX))
        return torch.from_numpy(out)


# --- reading data/features ------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _require(path: Path) -> Path:
    if not path.exists():
        raise DataError("not found; run `contextual-bert features` first", path=path)
    return path


def _padded(column: pa.ChunkedArray | pa.Array, width: int) -> np.ndarray:
    """An Arrow list<int> column -> (N, width) int64, PAD-padded at the end."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], type=column.type)
    lengths = column.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if len(lengths) and lengths.max() > width:
        raise ContextualBertError(f"a stored list has {lengths.max()} values, more than its width {width}")
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    out = np.full((len(lengths), width), PAD_INDEX, dtype=np.int64)
    out[rows, np.arange(len(values)) - starts[rows]] = values
    return out

def load_spec(features_dir: Path) -> ContextSpec:
    return ContextSpec.load(_require(Path(features_dir) / SPEC_FILE))


def split_outfit_ids(features_dir: Path, split: str) -> list[str]:
    """The ids of one split's outfits, in load_split's order."""
    path = _require(Path(features_dir) / OUTFITS_FILE)
    return [str(i) for i in pq.read_table(path, columns=["outfit_id"], filters=[("split", "==", split)])
            .column("outfit_id").to_pylist()]


def _column(table: pa.Table, name: str, path: Path) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise DataError("column absent; re-run `contextual-bert features`", path=path, column=name)
    return table.column(name)


def _feature_array(table: pa.Table, feature: FeatureSpec, path: Path) -> np.ndarray:
    column = _column(table, feature.name, path)
    if feature.is_list:
        return _padded(column, feature.max_values)
    return column.to_numpy().astype(np.int64)


def load_split(features_dir: Path, split: str, max_set_size: int, catalogue: bool = False) -> EncodedOutfits:
    """One split's outfits as tensors, each outfit's customer context joined on.

    Items are catalogue indices (features.article_features on) or vocabulary indices. A model of article
    ids only (catalogue=False) reads an article outside the train vocabulary as [UNK], as it always has."""
    if split not in SPLITS:
        raise ContextualBertError(f"unknown split '{split}', expected one of {SPLITS}")
    features_dir = Path(features_dir)
    spec = load_spec(features_dir)
    outfits_path = _require(features_dir / OUTFITS_FILE)
    customers_path = _require(features_dir / CUSTOMERS_FILE)
    outfits = pq.read_table(outfits_path, filters=[("split", "==", split)])
    lengths = _column(outfits, "items", outfits_path).combine_chunks().value_lengths().to_numpy(
        zero_copy_only=False)
    if len(lengths) and lengths.max() > max_set_size:
        row = int(np.argmax(lengths))
        raise DataError(f"an outfit has {lengths.max()} items, more than max_set_size={max_set_size}",
                        path=outfits_path, row=row, column="items")
    items = _padded(outfits.column("items"), max_set_size)
    n_vocab = None
    if not catalogue:
        n_vocab = pq.read_metadata(_require(features_dir / ARTICLE_VOCAB_FILE)).num_rows
        items[items >= n_vocab] = UNKNOWN_INDEX

    customers = pq.read_table(customers_path)
    customer_pos = pd.Index(customers.column("customer_id").to_pylist()).get_indexer(
        outfits.column("customer_id").to_pylist())
    context = {}
    for feature in spec.features:
        if feature.source == "customer":
            per_customer = _feature_array(customers, feature, customers_path)
            # a last row, all missing, for the outfits without a customer row (position -1)
            missing_row = np.full((1, *per_customer.shape[1:]), PAD_INDEX, dtype=np.int64)
            missing_row.reshape(-1)[0] = MISSING_INDEX
            per_customer = np.concatenate([per_customer, missing_row])
            context[feature.name] = torch.from_numpy(per_customer[customer_pos])
        else:
            values = _feature_array(outfits, feature, outfits_path)
            if feature.source == "history" and not catalogue:  # article indices, read as the items are
                values[values >= n_vocab] = UNKNOWN_INDEX
            context[feature.name] = torch.from_numpy(values)
    return EncodedOutfits(torch.from_numpy(items), context, outfits.column("outfit_id").to_pylist())
