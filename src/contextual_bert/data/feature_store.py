"""The feature store: what the features stage wrote to data/features, and how everyone reads it.

File names and the loaders. Training, evaluation, tracking, the registry and serving read data/features only
through this module; the stage that writes it is `features.py`. The values' encoding is `encoding.py`'s, the
vocabularies `vocabularies.py`'s, the encoder of raw outfits (serving) `outfit_encoder.py`'s.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from contextual_bert.data.feature_spec import (
    MISSING_INDEX,
    PAD_INDEX,
    UNKNOWN_INDEX,
    VECTOR_KIND,
    ContextSpec,
    EncodedOutfits,
    FeatureSpec,
)
from contextual_bert.data.vectors import TextVectors, read_vectors, vector_array
from contextual_bert.data.vocabularies import ArticleVocab, Catalogue, ContextIndexer
from contextual_bert.errors import ContextualBertError, DataError

SPLITS = ("train", "val", "test")
SPECIAL_ARTICLES = ("[PAD]", "[MASK]", "[UNK]")
ARTICLE_VOCAB_FILE = "article_vocab.parquet"
CONTEXT_VOCAB_FILE = "context_vocab.json"
CUSTOMERS_FILE = "customers.parquet"
OUTFITS_FILE = "outfits.parquet"
SPEC_FILE = "spec.json"
MANIFEST_FILE = "manifest.json"
# With features.article_features on: every article of the catalogue with its encoded attributes, and the
# attributes' spec and vocabularies (to encode articles added to the catalogue later, at serving); with vectors
# derived from the catalogue's text (features.derived_vectors), their words, idf and SVD components.
CATALOGUE_FILE = "catalogue.parquet"
ATTRIBUTES_FILE = "article_attributes.json"
DERIVED_VECTORS_FILE = "derived_vectors.parquet"
# What a trained model needs besides its checkpoint to read requests (logged with each run, bundled with
# each served model): its vocabularies, the spec, and the manifest for lineage; and the catalogue files
# where the features stage wrote them.
MODEL_FEATURE_FILES = (ARTICLE_VOCAB_FILE, CONTEXT_VOCAB_FILE, SPEC_FILE, MANIFEST_FILE)
CATALOGUE_FEATURE_FILES = (CATALOGUE_FILE, ATTRIBUTES_FILE, DERIVED_VECTORS_FILE)


# --- reading data/features ------------------------------------------------------------------------------


def load_context_indexer(features_dir: Path) -> ContextIndexer:
    """The context features' vocabularies, with the spec: what encodes raw context as the stage stored it."""
    features_dir = Path(features_dir)
    path = _require(features_dir / CONTEXT_VOCAB_FILE)
    return ContextIndexer(load_spec(features_dir), json.loads(path.read_text()))


def load_article_vocab(features_dir: Path) -> ArticleVocab:
    table = pd.read_parquet(_require(Path(features_dir) / ARTICLE_VOCAB_FILE)).sort_values("index")
    return ArticleVocab(table["article_id"].astype(str).tolist(), table["count"].to_numpy(dtype=np.int64))


def load_catalogue(features_dir: Path) -> Catalogue:
    """The catalogue the features stage wrote (features.article_features on), or a one-line error."""
    features_dir = Path(features_dir)
    attributes_path = features_dir / ATTRIBUTES_FILE
    if not attributes_path.exists():
        raise DataError(
            "not found: the article attributes are off; set features.article_features: true and "
            "run `contextual-bert features`",
            path=attributes_path,
        )
    saved = json.loads(attributes_path.read_text())
    spec = ContextSpec.from_json(json.dumps({"features": saved["spec"]}))
    path = _require(features_dir / CATALOGUE_FILE)
    table = pq.read_table(path)
    order = np.argsort(_column(table, "index", path).to_numpy())
    table = table.take(pa.array(order))
    vocab = ArticleVocab(
        [str(a) for a in table.column("article_id").to_pylist()], table.column("count").to_numpy().astype(np.int64)
    )
    attributes = {f.name: _feature_array(table, f, path) for f in spec.features}
    derived = {name: entry["derived"]["columns"] for name, entry in saved["vocab"].items() if "derived" in entry}
    if derived:
        words = pq.read_table(_require(features_dir / DERIVED_VECTORS_FILE))
        derived = {name: TextVectors.from_table(words, name, columns) for name, columns in derived.items()}
    return Catalogue(vocab, int(saved["n_ids"]), attributes, ContextIndexer(spec, saved["vocab"], derived))


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


def list_column(padded: np.ndarray) -> pa.ListArray:
    """(N, W) PAD-padded indices -> an Arrow list<int64> column without the padding (`_padded`'s inverse)."""
    keep = padded != PAD_INDEX
    offsets = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(padded[keep], type=pa.int64()))


def stored_columns(encoded: dict[str, np.ndarray]) -> dict[str, pa.Array]:
    """Encoded features as the stage stores them: an index per row (int64), a list of indices, or a vector
    (float32 rows, NaN for none: a list<float32>, null for none)."""
    return {name: vector_array(a) if a.dtype.kind == "f" else list_column(a) if a.ndim == 2
            else pa.array(a, type=pa.int64()) for name, a in encoded.items()}  # fmt: skip


def load_spec(features_dir: Path) -> ContextSpec:
    return ContextSpec.load(_require(Path(features_dir) / SPEC_FILE))


def split_outfit_ids(features_dir: Path, split: str) -> list[str]:
    """The ids of one split's outfits, in load_split's order."""
    path = _require(Path(features_dir) / OUTFITS_FILE)
    return [
        str(i)
        for i in pq.read_table(path, columns=["outfit_id"], filters=[("split", "==", split)])
        .column("outfit_id")
        .to_pylist()
    ]


def _column(table: pa.Table, name: str, path: Path) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise DataError("column absent; re-run `contextual-bert features`", path=path, column=name)
    return table.column(name)


def _feature_array(table: pa.Table, feature: FeatureSpec, path: Path) -> np.ndarray:
    column = _column(table, feature.name, path)
    if feature.kind == VECTOR_KIND:  # (n, length) float32, a NaN row without a vector
        return read_vectors(column, feature.max_values).matrix
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
    lengths = _column(outfits, "items", outfits_path).combine_chunks().value_lengths().to_numpy(zero_copy_only=False)
    if len(lengths) and lengths.max() > max_set_size:
        row = int(np.argmax(lengths))
        raise DataError(
            f"an outfit has {lengths.max()} items, more than max_set_size={max_set_size}",
            path=outfits_path,
            row=row,
            column="items",
        )
    items = _padded(outfits.column("items"), max_set_size)
    n_vocab = None
    if not catalogue:
        n_vocab = pq.read_metadata(_require(features_dir / ARTICLE_VOCAB_FILE)).num_rows
        items[items >= n_vocab] = UNKNOWN_INDEX

    customers = pq.read_table(customers_path)
    customer_pos = pd.Index(customers.column("customer_id").to_pylist()).get_indexer(
        outfits.column("customer_id").to_pylist()
    )
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
