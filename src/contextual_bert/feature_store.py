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
- numeric: quantile bucket edges of the train values (`numeric_buckets` buckets, tied edges merged);
  bucket b (0-based, `searchsorted(edges, x, side="right")`) -> index b + N_SPECIAL. NaN -> MISSING_INDEX,
  a value that is not a number -> UNKNOWN_INDEX.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from contextual_bert.errors import ContextualBertError, DataError
from contextual_bert.feature_spec import (
    MISSING_INDEX,
    N_SPECIAL,
    PAD_INDEX,
    UNKNOWN_INDEX,
    ContextSpec,
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
# What a trained model needs besides its checkpoint to read requests (logged with each run, bundled with
# each served model): its vocabularies, the spec, and the manifest for lineage.
MODEL_FEATURE_FILES = (ARTICLE_VOCAB_FILE, CONTEXT_VOCAB_FILE, SPEC_FILE, MANIFEST_FILE)


# --- encoding: the one code path for stored tables and serving -------------------------------------------

def as_object_series(values) -> pd.Series:
    return pd.Series(list(values) if not isinstance(values, pd.Series) else values.to_numpy(), dtype=object)


def missing_scalar(s: pd.Series) -> np.ndarray:
    missing = s.isna().to_numpy()
    text = s.where(~missing, "").astype(str)
    return missing | (text.str.len() == 0).to_numpy()


def _lookup(text: pd.Series, values: pd.Index) -> np.ndarray:
    """Index of each string in the vocabulary, UNKNOWN_INDEX when absent."""
    pos = values.get_indexer(text) if len(values) else np.full(len(text), -1)
    return np.where(pos < 0, UNKNOWN_INDEX, pos + N_SPECIAL).astype(np.int64)


def encode_categorical(values, vocab: pd.Index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices (N,), missing (N,), unknown (N,)) for one categorical column."""
    s = as_object_series(values)
    missing = missing_scalar(s)
    idx = _lookup(s.where(~missing, "").astype(str), vocab)
    unknown = (idx == UNKNOWN_INDEX) & ~missing
    idx[missing] = MISSING_INDEX
    return idx, missing, unknown


def explode_values(values) -> tuple[np.ndarray, pd.Series]:
    """(row of each value, the value as a string) for list-valued cells, missing and empty values dropped."""
    exploded = as_object_series(values).explode()
    exploded = exploded[~missing_scalar(exploded)]
    return exploded.index.to_numpy(dtype=np.int64), exploded.astype(str).reset_index(drop=True)


def encode_multi(values, vocab: pd.Index, max_values: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices (N, max_values) PAD-padded, missing (N,), unknown (N,)) for one list-valued column."""
    n = len(values)
    rows, text = explode_values(values)
    idx = _lookup(text, vocab)
    unknown = np.zeros(n, dtype=bool)
    unknown[rows[idx == UNKNOWN_INDEX]] = True
    pairs = pd.DataFrame({"row": rows, "idx": idx}).drop_duplicates()  # keeps the first occurrence
    slot = pairs.groupby("row", sort=False).cumcount().to_numpy()
    keep = slot < max_values
    out = np.full((n, max_values), PAD_INDEX, dtype=np.int64)
    out[pairs["row"].to_numpy()[keep], slot[keep]] = pairs["idx"].to_numpy()[keep]
    missing = np.ones(n, dtype=bool)
    missing[rows] = False
    out[missing, 0] = MISSING_INDEX
    return out, missing, unknown


def to_float(s: pd.Series) -> pd.Series:
    try:
        return pd.to_numeric(s, errors="coerce").astype(np.float64)
    except (TypeError, ValueError):  # cells that are lists or other objects: one by one
        return pd.Series([pd.to_numeric(v, errors="coerce") if np.isscalar(v) else np.nan for v in s], dtype=float)


def encode_numeric(values, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bucket indices (N,), missing (N,), unknown (N,)) for one numeric column."""
    s = as_object_series(values)
    missing = missing_scalar(s)
    number = to_float(s).to_numpy()
    unknown = np.isnan(number) & ~missing
    idx = (np.searchsorted(edges, number, side="right") + N_SPECIAL).astype(np.int64)
    idx[missing] = MISSING_INDEX
    idx[unknown] = UNKNOWN_INDEX
    return idx, missing, unknown


class ContextIndexer:
    """Raw context values -> index tensors, exactly as the features stage stored them for training."""

    def __init__(self, spec: ContextSpec, vocab: dict[str, dict]):
        self.spec = spec
        self.vocab = vocab
        self._index = {name: pd.Index(v["values"], dtype=object) for name, v in vocab.items() if "values" in v}
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
        return encode_numeric(values, self._edges[feature.name])

    def encode_arrays(self, rows: pd.DataFrame, source: str | None = None):
        """Numpy (indices, missing, unknown) dicts for every feature of `source` (all when None).

        A feature whose column is absent from `rows` is missing on every row.
        """
        indices, missing, unknown = {}, {}, {}
        n = len(rows)
        for feature in self.spec.features:
            if source is not None and feature.source != source:
                continue
            column = rows[feature.name] if feature.name in rows.columns else pd.Series([None] * n, dtype=object)
            name = feature.name
            indices[name], missing[name], unknown[name] = self.encode_feature(feature, column)
        return indices, missing, unknown

    def encode(self, rows: pd.DataFrame) -> tuple[dict[str, torch.Tensor], list[dict]]:
        """Index tensors for every context feature, and per row the features that were missing or unknown."""
        indices, missing, unknown = self.encode_arrays(rows.reset_index(drop=True))
        tensors = {name: torch.from_numpy(a) for name, a in indices.items()}
        reports = [
            {
                "missing": [name for name in indices if missing[name][i]],
                "unknown": [name for name in indices if unknown[name][i]],
            }
            for i in range(len(rows))
        ]
        return tensors, reports


# --- the article vocabulary ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArticleVocab:
    """Article ids by index ([PAD], [MASK], [UNK] first) and their occurrence counts in the train split."""

    ids: list[str]
    counts: np.ndarray

    def __post_init__(self):
        object.__setattr__(self, "_index", pd.Index(self.ids[N_SPECIAL:], dtype=object))

    def __len__(self) -> int:
        return len(self.ids)

    def to_indices(self, article_ids) -> tuple[np.ndarray, list[str]]:
        """(int64 indices, the ids not in the vocabulary); those map to UNKNOWN_INDEX."""
        ids = as_object_series(article_ids).astype(str)
        idx = _lookup(ids, self._index)
        return idx, ids[idx == UNKNOWN_INDEX].tolist()

    def to_ids(self, indices) -> list[str]:
        if isinstance(indices, torch.Tensor):
            indices = indices.tolist()
        return [self.ids[int(i)] for i in np.asarray(indices).ravel()]


def load_article_vocab(features_dir: Path) -> ArticleVocab:
    table = pd.read_parquet(_require(Path(features_dir) / ARTICLE_VOCAB_FILE)).sort_values("index")
    return ArticleVocab(table["article_id"].astype(str).tolist(), table["count"].to_numpy(dtype=np.int64))


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


def load_manifest(features_dir: Path) -> dict:
    return json.loads(_require(Path(features_dir) / MANIFEST_FILE).read_text())


def _column(table: pa.Table, name: str, path: Path) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise DataError("column absent; re-run `contextual-bert features`", path=path, column=name)
    return table.column(name)


def _feature_array(table: pa.Table, feature: FeatureSpec, path: Path) -> np.ndarray:
    column = _column(table, feature.name, path)
    if feature.kind == "multi_categorical":
        return _padded(column, feature.max_values)
    return column.to_numpy().astype(np.int64)


def load_split(features_dir: Path, split: str, max_set_size: int) -> EncodedOutfits:
    """One split's outfits as tensors, each outfit's customer context joined on."""
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

    customers = pq.read_table(customers_path)
    customer_pos = pd.Index(customers.column("customer_id").to_pylist()).get_indexer(
        outfits.column("customer_id").to_pylist())
    if (customer_pos < 0).any():
        raise DataError("an outfit's customer is not in customers.parquet; re-run `contextual-bert features`",
                        path=customers_path, row=int(np.flatnonzero(customer_pos < 0)[0]))
    context = {}
    for feature in spec.features:
        if feature.source == "customer":
            per_customer = _feature_array(customers, feature, customers_path)
            context[feature.name] = torch.from_numpy(per_customer[customer_pos])
        else:
            context[feature.name] = torch.from_numpy(_feature_array(outfits, feature, outfits_path))
    return EncodedOutfits(torch.from_numpy(items), context, outfits.column("outfit_id").to_pylist())
