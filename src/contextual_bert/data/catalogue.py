"""The features stage's catalogue (features.article_features with attributes declared for the source): every
article of the articles table and of the train vocabulary, with its attributes encoded (`build_catalogue`), and
its files in data/features (`write_catalogue`; read back by feature_store.load_catalogue)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from contextual_bert.config import FeaturesConfig
from contextual_bert.data.feature_spec import (
    MISSING_INDEX,
    N_SPECIAL,
    PAD_INDEX,
    UNKNOWN_INDEX,
    VECTOR_KIND,
    ContextSpec,
    FeatureKind,
    FeatureSpec,
)
from contextual_bert.data.feature_store import ATTRIBUTES_FILE, CATALOGUE_FILE, DERIVED_VECTORS_FILE, stored_columns
from contextual_bert.data.fitting import fit_feature
from contextual_bert.data.vectors import TextVectors, check_vectors, fit_vector, read_vectors
from contextual_bert.data.vocabularies import ArticleVocab, Catalogue, ContextIndexer
from contextual_bert.errors import DataError


def _check_columns(articles: pd.DataFrame, attributes: Mapping[str, str], derived: set[str], path: Path) -> None:
    """Every declared attribute is a column of the articles table, or a vector derived from its text."""
    for name in attributes:
        if name in derived and name in articles.columns:
            raise DataError(
                f"features.derived_vectors.{name} is also a column of the articles table: rename one", path=path,
                column=name,
            )  # fmt: skip
        if name not in derived and name not in articles.columns:
            raise DataError(
                f"article attribute '{name}' (features.article_attributes) is not a column of the "
                f"articles table; it has {sorted(articles.columns)}",
                path=path,
                column=name,
            )


def _fit_vector_attribute(
    name: str, articles: pd.DataFrame, catalogue_rows: pd.DataFrame, cfg: FeaturesConfig, path: Path
) -> tuple[FeatureSpec, dict, TextVectors | None]:
    """A vector attribute's spec, vocabulary entry and, for a derived one, its text transform: fitted on every
    article of the catalogue (a vector needs no training outfit; the TF-IDF's words are the catalogue's own)."""
    derived = None
    if name in cfg.derived_vectors:
        setting = cfg.derived_vectors[name]
        derived = TextVectors.fit(catalogue_rows, setting.columns, setting.dim, cfg.min_text_count, path, name)
        vectors = derived.transform(catalogue_rows)
    else:  # checked in the table as read, so that a bad one is named by its row there
        length = check_vectors(articles[name], articles["article_id"].astype(str).to_numpy(), path, name).length
        vectors = read_vectors(catalogue_rows[name], length).matrix
    entry = fit_vector(vectors, cfg.vector_normalize.get(name, "none"), path, name)
    if derived is not None:
        entry["derived"] = {"columns": list(derived.columns)}
    return FeatureSpec(name, VECTOR_KIND, "article", 0, cfg.default_dim, entry["length"]), entry, derived


def build_catalogue(
    articles: pd.DataFrame,
    article_vocab: ArticleVocab,
    train_counts: pd.Series,
    attributes: Mapping[str, FeatureKind],
    cfg: FeaturesConfig,
    path: Path,
) -> Catalogue:
    """Every article of the articles table (and of the train vocabulary) with its attributes encoded.

    The attribute vocabularies are fitted on the articles of the train vocabulary (a value needs
    `min_context_count` of them, else it is UNKNOWN): a value no trained article has would enter with an
    embedding training never moved. A vector attribute is fitted on every article of the catalogue
    (`_fit_vector_attribute`). Every article of the catalogue is encoded, whatever its values; a missing value,
    or an article of the vocabulary without a row in the articles table, is missing."""
    derived_names = {n for n, kind in attributes.items() if kind == VECTOR_KIND and n in cfg.derived_vectors}
    _check_columns(articles, attributes, derived_names, path)
    by_id = articles.assign(article_id=articles["article_id"].astype(str)).drop_duplicates("article_id")
    known = set(article_vocab.ids[N_SPECIAL:])
    extra = sorted(set(by_id["article_id"]) - known)
    ids = article_vocab.ids + extra
    rows = pd.DataFrame({"article_id": ids}).merge(by_id, on="article_id", how="left")  # keeps the order
    trained = rows.iloc[N_SPECIAL : len(article_vocab)]
    features, vocab, derived = [], {}, {}
    for name, kind in attributes.items():
        if kind == VECTOR_KIND:
            feature, vocab[name], text = _fit_vector_attribute(name, articles, rows.iloc[N_SPECIAL:], cfg, path)
            if text is not None:
                derived[name] = text
        else:
            feature, vocab[name] = fit_feature(
                name, kind, "article", trained[name], cfg, cfg.default_dim, cfg.min_context_count
            )
        features.append(feature)
    indexer = ContextIndexer(ContextSpec(tuple(features)), vocab, derived)
    encoded, _, _ = indexer.encode_arrays(rows, source="article")
    for a in encoded.values():  # the special rows have no attributes: PAD, a zero vector (a vector: none)
        a[:N_SPECIAL] = np.nan if a.dtype.kind == "f" else PAD_INDEX
    # train occurrences of every article, those below min_article_count (no id embedding) included
    counts = np.concatenate([article_vocab.counts,
                             train_counts.reindex(extra).fillna(0).to_numpy(dtype=np.int64)])  # fmt: skip
    return Catalogue(ArticleVocab(ids, counts), len(article_vocab), encoded, indexer)


def write_catalogue(catalogue: Catalogue, features_dir: Path) -> dict:
    """catalogue.parquet and article_attributes.json (and, with derived vectors, their words); the counts for
    the manifest: per attribute the articles whose value is missing (a vector: without one) or unknown."""
    n = len(catalogue)
    pq.write_table(
        pa.table(
            {
                "index": pa.array(np.arange(n), type=pa.int64()),
                "article_id": pa.array(catalogue.vocab.ids),
                "count": pa.array(catalogue.vocab.counts, type=pa.int64()),
                "has_id": pa.array(np.arange(n) < catalogue.n_ids),
                **stored_columns(catalogue.attributes),
            }
        ),
        features_dir / CATALOGUE_FILE,
    )
    spec = json.loads(catalogue.spec.to_json())["features"]
    (features_dir / ATTRIBUTES_FILE).write_text(
        json.dumps({"n_ids": catalogue.n_ids, "spec": spec, "vocab": catalogue.indexer.vocab}, indent=2)
    )
    derived = catalogue.indexer.derived
    if derived:
        pq.write_table(pa.concat_tables([t.table(name) for name, t in derived.items()]),
                       features_dir / DERIVED_VECTORS_FILE)  # fmt: skip
    real = slice(N_SPECIAL, None)
    first = lambda a: a[real] if a.ndim == 1 else a[real, 0]  # noqa: E731
    vectors = {k for k, a in catalogue.attributes.items() if a.dtype.kind == "f"}  # NaN rows: without a vector
    return {
        "articles": n - N_SPECIAL,
        "with_id": catalogue.n_ids - N_SPECIAL,
        "spec": spec,
        "missing": {
            k: int(np.isnan(first(a)).sum() if k in vectors else (first(a) == MISSING_INDEX).sum())
            for k, a in catalogue.attributes.items()
        },
        "unknown": {
            k: int((first(a) == UNKNOWN_INDEX).sum()) for k, a in catalogue.attributes.items() if k not in vectors
        },
    }
