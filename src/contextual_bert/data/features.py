"""The features stage: splits, the article vocabulary, context vocabularies/buckets and the encoded tables.

Reads data/validated (the raw contract, `contract.py`) and writes data/features (file names in
`feature_store.py` and docs/architecture.md; everyone else reads it through `feature_store`). Everything
learned from data (article vocabulary, context vocabularies, numeric bucket edges) is fit on the TRAIN split
only, so validation and test rows can hold unseen values exactly as serving requests can. The encoding
rules are in `encoding.py`, the fitting in `fitting.py`; the catalogue of every article with its attributes
(article vectors included: `vectors.py`) is built by `catalogue.py`.

Split: by outfit, from a keyed hash (BLAKE2b, 8 bytes, key = `split_seed`) of the outfit_id mapped to
[0, 1): below `test_fraction` -> test, below `test_fraction + val_fraction` -> val, else train. An outfit
keeps its split when other rows are added or removed. With `features.split: time`, by date instead
(assign_time_splits): the latest outfits test, those before them validate.

History (`features.history`): each outfit's customer's earlier articles (history.py's rule), stored as one
more per-outfit list of article indices, the feature `history` of the spec (docs/history.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from contextual_bert.config import FeaturesConfig
from contextual_bert.data.catalogue import build_catalogue, write_catalogue
from contextual_bert.data.contract import ID_COLUMN, SCHEMA_FILE, TABLES, DataSchema
from contextual_bert.data.feature_spec import (
    HISTORY_FEATURE,
    N_SPECIAL,
    PAD_INDEX,
    UNKNOWN_INDEX,
    ContextSpec,
    FeatureSource,
    FeatureSpec,
)
from contextual_bert.data.feature_store import (
    ARTICLE_VOCAB_FILE,
    CATALOGUE_FEATURE_FILES,
    CONTEXT_VOCAB_FILE,
    CUSTOMERS_FILE,
    MANIFEST_FILE,
    OUTFITS_FILE,
    SPEC_FILE,
    SPECIAL_ARTICLES,
    SPLITS,
    file_sha256,
    stored_columns,
)
from contextual_bert.data.fitting import fit_feature
from contextual_bert.data.history import earlier_outfits, eligible_rows, history_items
from contextual_bert.data.split_guards import check_splits, split_counts
from contextual_bert.data.splits import assign_splits, assign_time_splits, outfit_dates, split_fractions  # noqa: F401
from contextual_bert.data.vocabularies import ArticleVocab, ContextIndexer
from contextual_bert.errors import DataError

# Columns of the encoded outfits table that a context feature must not be named after.
OUTFIT_COLUMNS = ("outfit_id", "customer_id", "split", "items", HISTORY_FEATURE)
SOURCE_OF_TABLE: dict[str, FeatureSource] = {"customers": "customer", "outfits": "outfit"}


# --- splits ---------------------------------------------------------------------------------------------


def outfit_histories(outfits: pd.DataFrame, dates: pd.Series, eligible: np.ndarray, max_items: int) -> list[list[str]]:
    """Every outfit's history (history.py's rule): its article ids, as often as worn, the most worn first."""
    rows = earlier_outfits(_optional_ids(outfits["customer_id"]).to_numpy(), dates, eligible)
    items = outfits["article_ids"].map(lambda v: [str(a) for a in v]).tolist()
    return history_items(rows, items, max_items)


def history_article_ids(
    outfits: pd.DataFrame, splits: dict[str, str], cfg: FeaturesConfig, path: Path
) -> list[list[str]]:
    """The history every outfit of `outfits` (validated rows, every split) had in the features stage, as article
    ids: the same rule, the same split (`splits`: outfit id -> train / val / test), for a model to read outfits
    re-encoded through its own vocabularies (promotion)."""
    split = outfits["outfit_id"].astype(str).map(splits).fillna("").to_numpy()
    dates = outfit_dates(outfits, path, "features.history")
    return outfit_histories(outfits, dates, eligible_rows(split, cfg.split), cfg.history.max_items)


def history_column(
    outfits: pd.DataFrame, dates: pd.Series, eligible: np.ndarray, index_of_article, max_items: int
) -> np.ndarray:
    """(N, max_items) PAD-padded article indices of every outfit's history (history.py's rule: as often as
    worn, the most worn first); an outfit without history is all PAD."""
    histories = outfit_histories(outfits, dates, eligible, max_items)
    lengths = np.fromiter((len(h) for h in histories), dtype=np.int64, count=len(histories))
    flat = [a for h in histories for a in h]
    out = np.full((len(histories), max_items), PAD_INDEX, dtype=np.int64)
    if flat:
        rows_of = np.repeat(np.arange(len(histories)), lengths)
        out[rows_of, np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = index_of_article(flat)
    return out


# --- fitting on the train split ----------------------------------------------------------------------------


def fit_article_vocab(train_article_ids: pd.Series, min_count: int) -> ArticleVocab:
    """Articles seen at least `min_count` times in the train outfits, most frequent first (ties by id)."""
    counts = train_article_ids.astype(str).value_counts()
    counts = counts[counts >= min_count]
    order = sorted(zip(counts.index, counts.to_numpy()), key=lambda t: (-t[1], t[0]))
    ids = list(SPECIAL_ARTICLES) + [a for a, _ in order]
    return ArticleVocab(ids, np.array([0] * N_SPECIAL + [c for _, c in order], dtype=np.int64))


# --- the stage -------------------------------------------------------------------------------------------


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
            raise DataError(f"context column '{column.name}' clashes with a column of the features tables", path=path)
        seen.add(column.name)


def _check_outfit_sizes(outfits: pd.DataFrame, max_set_size: int, path: Path) -> np.ndarray:
    sizes = outfits["article_ids"].map(lambda v: -1 if v is None or np.ndim(v) == 0 else len(v)).to_numpy()
    bad = np.flatnonzero((sizes < 1) | (sizes > max_set_size))
    if len(bad):
        row = int(bad[0])
        what = "no articles" if sizes[row] < 1 else f"{sizes[row]} articles, more than max_set_size={max_set_size}"
        raise DataError(
            f"outfit '{outfits['outfit_id'].iloc[row]}' has {what} ({len(bad)} such outfit(s))",
            path=path,
            row=row,
            column="article_ids",
        )
    return sizes


def _optional_ids(ids: pd.Series) -> pd.Series:
    """Ids as str objects, None where missing (an outfit without a customer)."""
    return ids.astype(object).where(ids.notna(), None)


def _fit_context(
    schema: DataSchema, cfg: FeaturesConfig, train_customers: pd.DataFrame, train_outfits: pd.DataFrame
) -> tuple[ContextSpec, dict[str, dict]]:
    features, vocab = [], {}
    for column in schema.context_columns:
        values = (train_customers if column.table == "customers" else train_outfits)[column.name]
        dim = cfg.embedding_dims.get(column.name, cfg.default_dim)
        feature, vocab[column.name] = fit_feature(
            column.name, column.kind, SOURCE_OF_TABLE[column.table], values, cfg, dim, cfg.min_context_count
        )
        features.append(feature)
    return ContextSpec(tuple(features)), vocab


def _split_dates(dates: pd.Series | None, split: np.ndarray) -> dict[str, list[str]]:
    """A time split's first and last outfit date in each split."""
    assert dates is not None, "a time split reads the outfits' dates"
    return {
        f"{name}_dates": [str(d) for d in (dates[split == name].min().date(), dates[split == name].max().date())]
        for name in SPLITS
    }


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

    dates = (
        outfit_dates(outfits, outfits_path, "features.split: time" if cfg.split == "time" else "features.history")
        if cfg.split == "time" or cfg.history.enabled
        else None
    )
    if cfg.split == "time":
        split = assign_time_splits(dates, cfg.val_fraction, cfg.test_fraction)
    else:
        split = assign_splits(
            outfits["outfit_id"].astype(str).tolist(), cfg.val_fraction, cfg.test_fraction, cfg.split_seed
        )
    is_train = split == "train"

    # Article vocabulary from the train outfits; every outfit's items through it.
    exploded = outfits["article_ids"].explode()
    train_ids = exploded[is_train[exploded.index.to_numpy()]]
    article_vocab = fit_article_vocab(train_ids, cfg.min_article_count)
    item_idx, _ = article_vocab.to_indices(exploded.to_numpy())
    counts = split_counts(split, split[exploded.index.to_numpy()], item_idx != UNKNOWN_INDEX, SPLITS)
    check_splits(counts, cfg, outfits_path)
    catalogue = None
    # with no attribute declared for the source (e.g. curated pairs without a products table), the models of ids
    # and popularity as without the setting; the attribute rows say they are unavailable (no catalogue)
    attributes = cfg.article_attributes.get(schema.source) if cfg.article_features else None
    if attributes:  # items by catalogue index: the train vocabulary's indices, then the others
        catalogue = build_catalogue(
            tables["articles"],
            article_vocab,
            train_ids.astype(str).value_counts(),
            attributes,
            cfg,
            validated_dir / "articles.parquet",
        )
        stored_idx, _ = catalogue.vocab.to_indices(exploded.to_numpy())
    else:
        stored_idx = item_idx
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    items = pa.ListArray.from_arrays(pa.array(offsets), pa.array(stored_idx, type=pa.int64()))

    # Context vocabularies from the train rows: the outfits of the train split and their customers.
    in_train = np.zeros(len(customers), dtype=bool)  # a mask, not np.unique: numpy 2.4's is 10x slower
    in_train[customer_pos[is_train & (customer_pos >= 0)]] = True
    train_customers = customers.iloc[np.flatnonzero(in_train)]
    spec, context_vocab = _fit_context(schema, cfg, train_customers, outfits[is_train])
    encoder = ContextIndexer(spec, context_vocab)
    cust_idx, cust_missing, cust_unknown = encoder.encode_arrays(customers, source="customer")
    outfit_idx, outfit_missing, outfit_unknown = encoder.encode_arrays(outfits, source="outfit")
    if cfg.history.enabled:  # through the same article indices as the items (the catalogue's, with attributes)
        stored = catalogue.vocab if catalogue is not None else article_vocab
        history = history_column(
            outfits,
            dates,
            eligible_rows(split, cfg.split),
            lambda ids: stored.to_indices(ids)[0],
            cfg.history.max_items,
        )
        outfit_idx[HISTORY_FEATURE] = history
        outfit_missing[HISTORY_FEATURE] = (history == PAD_INDEX).all(axis=1)
        outfit_unknown[HISTORY_FEATURE] = (history == UNKNOWN_INDEX).any(axis=1)
        spec = ContextSpec(
            (
                *spec.features,
                FeatureSpec(HISTORY_FEATURE, "history", "history", len(stored), cfg.history.dim, cfg.history.max_items),
            )
        )

    features_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"customer_id": pa.array(customers["customer_id"].astype(str).tolist()), **stored_columns(cust_idx)}),
        features_dir / CUSTOMERS_FILE,
    )
    pq.write_table(
        pa.table(
            {
                "outfit_id": pa.array(outfits["outfit_id"].astype(str).tolist()),
                "customer_id": pa.array(customer_ids.tolist(), pa.string()),
                "split": pa.array(split.tolist()),
                "items": items,
                **stored_columns(outfit_idx),
            }
        ),
        features_dir / OUTFITS_FILE,
    )
    pq.write_table(
        pa.table(
            {
                "index": pa.array(np.arange(len(article_vocab)), type=pa.int64()),
                "article_id": pa.array(article_vocab.ids),
                "count": pa.array(article_vocab.counts, type=pa.int64()),
            }
        ),
        features_dir / ARTICLE_VOCAB_FILE,
    )
    (features_dir / CONTEXT_VOCAB_FILE).write_text(json.dumps(context_vocab, indent=2))
    spec.save(features_dir / SPEC_FILE)
    for stale in CATALOGUE_FEATURE_FILES:  # written again below when the attributes are on
        (features_dir / stale).unlink(missing_ok=True)
    catalogue_counts = write_catalogue(catalogue, features_dir) if catalogue is not None else None

    unknown_items = item_idx == UNKNOWN_INDEX
    item_split = split[exploded.index.to_numpy()]
    missing = {**cust_missing, **outfit_missing}
    unknown = {**cust_unknown, **outfit_unknown}
    manifest = {
        "source": schema.source,
        "rows": {
            **{name: int((split == name).sum()) for name in SPLITS},
            "outfits": len(outfits),
            "customers": len(customers),
            "articles": len(tables["articles"]),
        },
        "split": (
            {"method": "blake2b-64 of outfit_id keyed by split_seed", "seed": cfg.split_seed}
            if cfg.split == "hash"
            else {"method": "by date", **_split_dates(dates, split)}
        )
        | {"val_fraction": cfg.val_fraction, "test_fraction": cfg.test_fraction},
        "n_items": len(article_vocab),
        "unknown_items": {name: int(unknown_items[item_split == name].sum()) for name in SPLITS},
        **(
            {}
            if catalogue is None
            else {
                "catalogue": catalogue_counts,  # features.article_features on
                # items outside the train vocabulary that the catalogue holds: the attribute models rank them
                "catalogue_items_without_id": {
                    name: int((stored_idx >= catalogue.n_ids)[item_split == name].sum()) for name in SPLITS
                },
            }
        ),
        **(
            {
                "no_catalogue": f"features.article_attributes declares no attribute for the source '{schema.source}': "
                "the models of ids only; the attribute models and popularity are unavailable"
            }
            if cfg.article_features and catalogue is None
            else {}
        ),
        "known_targets": {name: c["known_targets"] for name, c in counts.items()},
        "outfits_without_customer_row": int((customer_pos < 0).sum()),  # their customer context is missing
        "vocab_sizes": {"articles": len(article_vocab), **{f.name: f.cardinality for f in spec.features}},
        "context_rows_missing": {name: int(m.sum()) for name, m in missing.items()},
        "context_rows_unknown": {name: int(u.sum()) for name, u in unknown.items()},
        "d_context": spec.d_context,
        "spec": json.loads(spec.to_json())["features"],
        "max_set_size": max_set_size,
        # the attribute settings only when they are on: with them off, the stage writes exactly the files
        # it wrote before attributes existed (same DVC hash, the trained models' lineage still matches)
        # (and history, the split method and the vectors' settings only when not at their defaults, for the same
        # reason)
        "params": cfg.model_dump(
            exclude=(set() if cfg.article_features else {"article_features", "article_attributes"})
            | (set() if cfg.history.enabled else {"history"})
            | (set() if cfg.split == "time" else {"split"})
            | {name for name in ("vector_normalize", "derived_vectors") if not getattr(cfg, name)}
        ),
        "inputs": {f"{t}.parquet": file_sha256(validated_dir / f"{t}.parquet") for t in TABLES}
        | {SCHEMA_FILE: file_sha256(validated_dir / SCHEMA_FILE)},
    }
    (features_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
    return manifest
