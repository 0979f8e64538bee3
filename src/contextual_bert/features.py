"""The features stage: splits, the article vocabulary, context vocabularies/buckets and the encoded tables.

Reads data/validated (the raw contract, `contract.py`) and writes data/features (file names in
docs/architecture.md). Everything learned from data (article vocabulary, context vocabularies, numeric
bucket edges) is fit on the TRAIN split only, so validation and test rows can hold unseen values exactly
as serving requests can.

Encoding rules (one code path, `ContextEncoder`, for the stored tables and for serving):
- categorical: the value as a string; vocabulary = train values seen at least `min_context_count` times,
  sorted, index = position + N_SPECIAL. None/NaN/"" -> MISSING_INDEX, anything else unseen -> UNKNOWN_INDEX.
- multi_categorical: each value encoded as above, duplicate indices dropped keeping the first, then the
  first `max_values` indices kept in the order the values were listed (the cap is deterministic and keeps
  what the data lists first). None or an empty list -> a single MISSING_INDEX, so every row has at least
  one index to pool. A plain string counts as a one-value list.
- numeric: quantile bucket edges of the train values (`numeric_buckets` buckets, tied edges merged);
  bucket b (0-based, `searchsorted(edges, x, side="right")`) -> index b + N_SPECIAL. NaN -> MISSING_INDEX,
  a value that is not a number -> UNKNOWN_INDEX.

Split: by outfit, from a keyed hash (BLAKE2b, 8 bytes, key = `split_seed`) of the outfit_id mapped to
[0, 1): below `test_fraction` -> test, below `test_fraction + val_fraction` -> val, else train. An outfit
keeps its split when other rows are added or removed.
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

from contextual_bert.config import FeaturesConfig
from contextual_bert.contract import ID_COLUMN, SCHEMA_FILE, TABLES, DataSchema
from contextual_bert.errors import ContextualBertError, DataError
from contextual_bert.split_guards import check_splits, split_counts
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
# Columns of the encoded outfits table that a context feature must not be named after.
OUTFIT_COLUMNS = ("outfit_id", "customer_id", "split", "items")
SOURCE_OF_TABLE = {"customers": "customer", "outfits": "outfit"}


# --- splits ---------------------------------------------------------------------------------------------


def split_fractions(outfit_ids, seed: int) -> np.ndarray:
    """A number in [0, 1) per outfit id, from a keyed BLAKE2b hash: stable across runs, machines and rows."""
    key = int(seed).to_bytes(8, "little", signed=True)
    hashes = np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(str(i).encode(), digest_size=8, key=key).digest(), "little")
            for i in outfit_ids
        ),
        dtype=np.uint64,
        count=len(outfit_ids),
    )
    return hashes.astype(np.float64) / 2.0**64


def assign_splits(outfit_ids, val_fraction: float, test_fraction: float, seed: int) -> np.ndarray:
    """'train' / 'val' / 'test' per outfit id (see the module docstring)."""
    u = split_fractions(outfit_ids, seed)
    return np.where(u < test_fraction, "test", np.where(u < test_fraction + val_fraction, "val", "train"))


# --- encoding: the one code path for stored tables and serving -------------------------------------------


def _as_object_series(values) -> pd.Series:
    return pd.Series(list(values) if not isinstance(values, pd.Series) else values.to_numpy(), dtype=object)


def _missing_scalar(s: pd.Series) -> np.ndarray:
    missing = s.isna().to_numpy()
    text = s.where(~missing, "").astype(str)
    return missing | (text.str.len() == 0).to_numpy()


def _lookup(text: pd.Series, values: pd.Index) -> np.ndarray:
    """Index of each string in the vocabulary, UNKNOWN_INDEX when absent."""
    pos = values.get_indexer(text) if len(values) else np.full(len(text), -1)
    return np.where(pos < 0, UNKNOWN_INDEX, pos + N_SPECIAL).astype(np.int64)


def encode_categorical(values, vocab: pd.Index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices (N,), missing (N,), unknown (N,)) for one categorical column."""
    s = _as_object_series(values)
    missing = _missing_scalar(s)
    idx = _lookup(s.where(~missing, "").astype(str), vocab)
    unknown = (idx == UNKNOWN_INDEX) & ~missing
    idx[missing] = MISSING_INDEX
    return idx, missing, unknown


def _explode_values(values) -> tuple[np.ndarray, pd.Series]:
    """(row of each value, the value as a string) for list-valued cells, missing and empty values dropped."""
    exploded = _as_object_series(values).explode()
    exploded = exploded[~_missing_scalar(exploded)]
    return exploded.index.to_numpy(dtype=np.int64), exploded.astype(str).reset_index(drop=True)


def encode_multi(values, vocab: pd.Index, max_values: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices (N, max_values) PAD-padded, missing (N,), unknown (N,)) for one list-valued column."""
    n = len(values)
    rows, text = _explode_values(values)
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


def _to_float(s: pd.Series) -> pd.Series:
    try:
        return pd.to_numeric(s, errors="coerce").astype(np.float64)
    except (TypeError, ValueError):  # cells that are lists or other objects: one by one
        return pd.Series([pd.to_numeric(v, errors="coerce") if np.isscalar(v) else np.nan for v in s], dtype=float)


def encode_numeric(values, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bucket indices (N,), missing (N,), unknown (N,)) for one numeric column."""
    s = _as_object_series(values)
    missing = _missing_scalar(s)
    number = _to_float(s).to_numpy()
    unknown = np.isnan(number) & ~missing
    idx = (np.searchsorted(edges, number, side="right") + N_SPECIAL).astype(np.int64)
    idx[missing] = MISSING_INDEX
    idx[unknown] = UNKNOWN_INDEX
    return idx, missing, unknown


# --- fitting on the train split ----------------------------------------------------------------------------


def fit_categorical(values, min_count: int) -> list[str]:
    s = _as_object_series(values)
    counts = s[~_missing_scalar(s)].astype(str).value_counts()
    return sorted(counts.index[counts >= min_count].tolist())


def fit_multi(values, min_count: int) -> tuple[list[str], int]:
    """(vocabulary, the longest list of distinct values in a row)."""
    rows, text = _explode_values(values)
    pairs = pd.DataFrame({"row": rows, "value": text.to_numpy()}).drop_duplicates()
    counts = pairs["value"].value_counts()
    longest = int(pairs.groupby("row").size().max()) if len(pairs) else 1
    return sorted(counts.index[counts >= min_count].tolist()), longest


def fit_numeric(values, n_buckets: int) -> list[float]:
    number = _to_float(_as_object_series(values)).to_numpy()
    number = number[~np.isnan(number)]
    if len(number) == 0:
        return []
    return np.unique(np.quantile(number, np.linspace(0, 1, n_buckets + 1)[1:-1])).tolist()


class ContextEncoder:
    """Raw context values -> index tensors, exactly as the features stage stored them for training."""

    def __init__(self, spec: ContextSpec, vocab: dict[str, dict]):
        self.spec = spec
        self.vocab = vocab
        self._index = {name: pd.Index(v["values"], dtype=object) for name, v in vocab.items() if "values" in v}
        self._edges = {name: np.asarray(v["bucket_edges"], dtype=np.float64) for name, v in vocab.items()
                       if "bucket_edges" in v}

    @classmethod
    def load(cls, features_dir: Path) -> "ContextEncoder":
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
        ids = _as_object_series(article_ids).astype(str)
        idx = _lookup(ids, self._index)
        return idx, ids[idx == UNKNOWN_INDEX].tolist()

    def to_ids(self, indices) -> list[str]:
        if isinstance(indices, torch.Tensor):
            indices = indices.tolist()
        return [self.ids[int(i)] for i in np.asarray(indices).ravel()]


def fit_article_vocab(train_article_ids: pd.Series, min_count: int) -> ArticleVocab:
    """Articles seen at least `min_count` times in the train outfits, most frequent first (ties by id)."""
    counts = train_article_ids.astype(str).value_counts()
    counts = counts[counts >= min_count]
    order = sorted(zip(counts.index, counts.to_numpy()), key=lambda t: (-t[1], t[0]))
    ids = list(SPECIAL_ARTICLES) + [a for a, _ in order]
    return ArticleVocab(ids, np.array([0] * N_SPECIAL + [c for _, c in order], dtype=np.int64))


def load_article_vocab(features_dir: Path) -> ArticleVocab:
    table = pd.read_parquet(_require(Path(features_dir) / ARTICLE_VOCAB_FILE)).sort_values("index")
    return ArticleVocab(table["article_id"].astype(str).tolist(), table["count"].to_numpy(dtype=np.int64))


# --- the stage -------------------------------------------------------------------------------------------


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


def _read_inputs(validated_dir: Path, schema: DataSchema) -> dict[str, pd.DataFrame]:
    tables = {}
    for table in TABLES:
        path = validated_dir / f"{table}.parquet"
        if not path.exists():
            raise DataError("not found; run `contextual-bert validate` first", path=path)
        frame = pd.read_parquet(path)
        for column in schema.columns_of(table):
            if column not in frame.columns:
                raise DataError("required column is absent", path=path, column=column)
        ids = frame[ID_COLUMN[table]]
        duplicated = ids.duplicated().to_numpy()
        if duplicated.any():
            row = int(np.flatnonzero(duplicated)[0])
            raise DataError(f"duplicate id '{ids.iloc[row]}'", path=path, row=row, column=ID_COLUMN[table])
        tables[table] = frame.reset_index(drop=True)
    return tables


def _check_schema(schema: DataSchema, path: Path) -> None:
    seen = set()
    for column in schema.context_columns:
        if column.name in seen:
            raise DataError(f"context column '{column.name}' is declared twice", path=path)
        if column.table == "outfits" and column.name in OUTFIT_COLUMNS:
            raise DataError(f"context column '{column.name}' clashes with a column of the features tables",
                            path=path)
        seen.add(column.name)


def _check_outfit_sizes(outfits: pd.DataFrame, max_set_size: int, path: Path) -> np.ndarray:
    sizes = outfits["article_ids"].map(lambda v: -1 if v is None or np.ndim(v) == 0 else len(v)).to_numpy()
    bad = np.flatnonzero((sizes < 1) | (sizes > max_set_size))
    if len(bad):
        row = int(bad[0])
        what = "no articles" if sizes[row] < 1 else f"{sizes[row]} articles, more than max_set_size={max_set_size}"
        raise DataError(
            f"outfit '{outfits['outfit_id'].iloc[row]}' has {what} ({len(bad)} such outfit(s))",
            path=path, row=row, column="article_ids",
        )
    return sizes


def _optional_ids(ids: pd.Series) -> pd.Series:
    """Ids as str objects, None where missing (an outfit without a customer)."""
    return ids.astype(object).where(ids.notna(), None)


def _list_array(padded: np.ndarray) -> pa.ListArray:
    """(N, W) PAD-padded indices -> an Arrow list<int64> column without the padding."""
    keep = padded != PAD_INDEX
    offsets = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(padded[keep], type=pa.int64()))


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


def _encoded_columns(indices: dict[str, np.ndarray]) -> dict[str, pa.Array]:
    return {name: _list_array(a) if a.ndim == 2 else pa.array(a, type=pa.int64()) for name, a in indices.items()}


def _fit_context(schema: DataSchema, cfg: FeaturesConfig, train_customers: pd.DataFrame,
                 train_outfits: pd.DataFrame) -> tuple[ContextSpec, dict[str, dict]]:
    features, vocab = [], {}
    for column in schema.context_columns:
        values = (train_customers if column.table == "customers" else train_outfits)[column.name]
        source = SOURCE_OF_TABLE[column.table]
        dim = cfg.embedding_dims.get(column.name, cfg.default_dim)
        max_values = 1
        if column.kind == "numeric":
            edges = fit_numeric(values, cfg.numeric_buckets)
            entry = {"kind": column.kind, "source": source, "bucket_edges": edges}
            cardinality = N_SPECIAL + len(edges) + 1
        else:
            if column.kind == "multi_categorical":
                values_seen, longest = fit_multi(values, cfg.min_context_count)
                max_values = min(cfg.max_multi_values, longest)
            else:
                values_seen = fit_categorical(values, cfg.min_context_count)
            entry = {"kind": column.kind, "source": source, "values": values_seen}
            cardinality = N_SPECIAL + len(values_seen)
        if column.kind == "multi_categorical":
            entry["max_values"] = max_values
        vocab[column.name] = entry
        features.append(FeatureSpec(column.name, column.kind, source, cardinality, dim, max_values))
    return ContextSpec(tuple(features)), vocab


def build_features(validated_dir: Path, features_dir: Path, cfg: FeaturesConfig, max_set_size: int) -> dict:
    """Fit vocabularies on the train split, write the encoded tables to `features_dir`; return the manifest."""
    validated_dir, features_dir = Path(validated_dir), Path(features_dir)
    schema = DataSchema.load(validated_dir)
    _check_schema(schema, validated_dir / SCHEMA_FILE)
    tables = _read_inputs(validated_dir, schema)
    outfits, customers = tables["outfits"], tables["customers"]
    outfits_path = validated_dir / "outfits.parquet"
    sizes = _check_outfit_sizes(outfits, max_set_size, outfits_path)

    # An outfit without a customer, or whose customer has no row, has its customer context missing (-1).
    customer_ids = _optional_ids(outfits["customer_id"])
    customer_pos = pd.Index(customers["customer_id"].astype(str)).get_indexer(customer_ids.astype(str))
    customer_pos[customer_ids.isna().to_numpy()] = -1

    split = assign_splits(outfits["outfit_id"].astype(str).tolist(), cfg.val_fraction, cfg.test_fraction,
                          cfg.split_seed)
    is_train = split == "train"

    # Article vocabulary from the train outfits; every outfit's items through it.
    exploded = outfits["article_ids"].explode()
    article_vocab = fit_article_vocab(exploded[is_train[exploded.index.to_numpy()]], cfg.min_article_count)
    item_idx, _ = article_vocab.to_indices(exploded.to_numpy())
    counts = split_counts(split, split[exploded.index.to_numpy()], item_idx != UNKNOWN_INDEX, SPLITS)
    check_splits(counts, cfg, outfits_path)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    items = pa.ListArray.from_arrays(pa.array(offsets), pa.array(item_idx, type=pa.int64()))

    # Context vocabularies from the train rows: the outfits of the train split and their customers.
    train_customers = customers.iloc[np.unique(customer_pos[is_train & (customer_pos >= 0)])]
    spec, context_vocab = _fit_context(schema, cfg, train_customers, outfits[is_train])
    encoder = ContextEncoder(spec, context_vocab)
    cust_idx, cust_missing, cust_unknown = encoder.encode_arrays(customers, source="customer")
    outfit_idx, outfit_missing, outfit_unknown = encoder.encode_arrays(outfits, source="outfit")

    features_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"customer_id": pa.array(customers["customer_id"].astype(str).tolist()),
                             **_encoded_columns(cust_idx)}), features_dir / CUSTOMERS_FILE)
    pq.write_table(pa.table({"outfit_id": pa.array(outfits["outfit_id"].astype(str).tolist()),
                             "customer_id": pa.array(customer_ids.tolist(), pa.string()),
                             "split": pa.array(split.tolist()), "items": items,
                             **_encoded_columns(outfit_idx)}), features_dir / OUTFITS_FILE)
    pq.write_table(pa.table({"index": pa.array(np.arange(len(article_vocab)), type=pa.int64()),
                             "article_id": pa.array(article_vocab.ids),
                             "count": pa.array(article_vocab.counts, type=pa.int64())}),
                   features_dir / ARTICLE_VOCAB_FILE)
    (features_dir / CONTEXT_VOCAB_FILE).write_text(json.dumps(context_vocab, indent=2))
    spec.save(features_dir / SPEC_FILE)

    unknown_items = item_idx == UNKNOWN_INDEX
    item_split = split[exploded.index.to_numpy()]
    missing = {**cust_missing, **outfit_missing}
    unknown = {**cust_unknown, **outfit_unknown}
    manifest = {
        "source": schema.source,
        "rows": {**{name: int((split == name).sum()) for name in SPLITS},
                 "outfits": len(outfits), "customers": len(customers), "articles": len(tables["articles"])},
        "split": {"method": "blake2b-64 of outfit_id keyed by split_seed", "seed": cfg.split_seed,
                  "val_fraction": cfg.val_fraction, "test_fraction": cfg.test_fraction},
        "n_items": len(article_vocab),
        "unknown_items": {name: int(unknown_items[item_split == name].sum()) for name in SPLITS},
        "known_targets": {name: c["known_targets"] for name, c in counts.items()},
        "outfits_without_customer_row": int((customer_pos < 0).sum()),  # their customer context is missing
        "vocab_sizes": {"articles": len(article_vocab), **{f.name: f.cardinality for f in spec.features}},
        "context_rows_missing": {name: int(m.sum()) for name, m in missing.items()},
        "context_rows_unknown": {name: int(u.sum()) for name, u in unknown.items()},
        "d_context": spec.d_context,
        "spec": json.loads(spec.to_json())["features"],
        "max_set_size": max_set_size,
        "params": cfg.model_dump(),
        "inputs": {f"{t}.parquet": file_sha256(validated_dir / f"{t}.parquet") for t in TABLES}
        | {SCHEMA_FILE: file_sha256(validated_dir / SCHEMA_FILE)},
    }
    (features_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
    return manifest


# --- loaders ---------------------------------------------------------------------------------------------


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
            context[feature.name] = torch.from_numpy(_feature_array(outfits, feature, outfits_path))
    return EncodedOutfits(torch.from_numpy(items), context, outfits.column("outfit_id").to_pylist())
