"""Article vectors, the attribute kind `vector`: a fixed-length float vector per article (an image's CLIP
embedding, a sentence embedding of its description), or one derived here from the catalogue's text.

Reading (`read_vectors`): a column of vectors as an (n, length) float32 matrix, a NaN row for an article without
one. A cell is a list of numbers: an Arrow (Parquet) list column's, a list or numpy array, or JSON text
'[0.1, 0.2]' (as a CSV holds a list); None, NaN or an empty list is no vector. The length is the one most vectors
have. A vector of another length, one holding a missing, NaN or infinite value, or a cell that is no list of
numbers is bad, with its reason: the features stage and serving stop on it (`check_vectors`: one line naming
file, row and column); the ingest join of a vectors file quarantines its row (vector_files.py).

Encoding (`fit_vector`, `encode_vector`: the one code path of the features stage and of serving): each vector
optionally scaled to length 1 (features.vector_normalize: l2), then all of them by one number, so that their
root-mean-square length over the catalogue is 1: the model's projection (model/articles.py, VectorProjection)
then starts at the id embeddings' scale, whatever the vectors' own; their relative lengths are kept. An article
without a vector stays in the catalogue; the model gives it a learned "missing" vector.

Derived vectors (`TextVectors`, features.derived_vectors): the TF-IDF of the words (encoding.text_words) of
some text columns, reduced by a truncated SVD, both fitted on every article of the catalogue, bought or not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from contextual_bert.data.encoding import LIST_LIKE, as_object_array, text_words
from contextual_bert.data.feature_spec import VECTOR_KIND
from contextual_bert.errors import DataError

NOT_A_LIST = "not a list of numbers"
NOT_FINITE = "a missing, NaN or infinite value in the vector"


@dataclass(frozen=True)
class Vectors:
    """A column of vectors as read: (n, length) float32, a NaN row where there is none or it is bad."""

    matrix: np.ndarray
    reasons: np.ndarray  # (n,) object: why a row's vector is bad; None where it is fine or absent
    length: int

    @property
    def bad(self) -> np.ndarray:
        """Rows whose vector is bad, in order."""
        return np.flatnonzero(pd.notna(self.reasons))

    @property
    def missing(self) -> np.ndarray:
        """(n,) bool: no (usable) vector."""
        return np.isnan(self.matrix).any(axis=1) if self.length else np.ones(len(self.matrix), dtype=bool)


def _numeric_list(kind: pa.DataType) -> bool:
    lists = pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    return lists and (pa.types.is_floating(kind.value_type) or pa.types.is_integer(kind.value_type))


def _cell(cell) -> np.ndarray | None | bool:
    """One cell's values (float64), None for no vector, False for a cell that is no list of numbers."""
    if isinstance(cell, str):
        text = cell.strip()
        if not text:
            return None
        try:
            cell = json.loads(text)
        except ValueError:
            return False
    if isinstance(cell, LIST_LIKE):
        try:
            values = np.asarray(cell, dtype=np.float64)
        except (TypeError, ValueError):
            return False
        return values if values.ndim == 1 else False
    if cell is None or (np.ndim(cell) == 0 and pd.isna(cell)):
        return None
    return False


def _flatten(values) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(each row's number of values, all values in row order, absent, unreadable) of any column of vectors:
    an Arrow list array read without a Python object per value (a catalogue of CLIP vectors holds millions),
    a 2-D float array as it is, anything else cell by cell."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], values.type)
    if isinstance(values, np.ndarray) and values.ndim == 2 and values.dtype.kind in "fiu":
        n, length = values.shape
        flat = values.astype(np.float64).ravel()
        absent = np.asarray(np.isnan(values).all(axis=1)) if length else np.ones(n, dtype=bool)
        return np.full(n, length, dtype=np.int64), flat, absent, np.zeros(n, dtype=bool)
    if isinstance(values, pa.Array) and _numeric_list(values.type):
        array = values.cast(pa.list_(pa.float64()))
        lengths = array.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        flat = array.flatten().to_numpy(zero_copy_only=False).astype(np.float64)  # a null inside: NaN
        absent = array.is_null().to_numpy(zero_copy_only=False) | (lengths == 0)
        return lengths, flat, absent, np.zeros(len(array), dtype=bool)
    cells = values.to_pylist() if isinstance(values, pa.Array) else as_object_array(values)
    parsed = [_cell(c) for c in cells]
    lengths = np.fromiter((len(p) if isinstance(p, np.ndarray) else 0 for p in parsed), np.int64, len(parsed))
    unreadable = np.fromiter((p is False for p in parsed), bool, len(parsed))
    absent = ~unreadable & (lengths == 0)
    arrays = [p for p in parsed if isinstance(p, np.ndarray)]
    flat = np.concatenate(arrays) if arrays else np.zeros(0)
    return lengths, flat, absent, unreadable


def read_vectors(values, length: int | None = None) -> Vectors:
    """A column of vectors (module docstring); `length` None: the one most present vectors have."""
    lengths, flat, absent, unreadable = _flatten(values)
    n = len(lengths)
    present = ~absent & ~unreadable
    if length is None:
        sizes, counts = np.unique(lengths[present], return_counts=True)
        length = int(sizes[np.argmax(counts)]) if len(sizes) else 0
    finite = np.ones(n, dtype=bool)
    finite[np.repeat(np.arange(n), lengths)[~np.isfinite(flat)]] = False
    wrong = present & (lengths != length)
    reasons = np.full(n, None, dtype=object)
    reasons[unreadable] = NOT_A_LIST
    for row in np.flatnonzero(wrong).tolist():
        reasons[row] = f"{lengths[row]} values, not {length} as the other vectors"
    reasons[present & ~wrong & ~finite] = NOT_FINITE
    good = np.flatnonzero(present & ~wrong & finite)
    matrix = np.full((n, length), np.nan, dtype=np.float32)
    starts = np.cumsum(lengths) - lengths
    matrix[good] = flat[starts[good, None] + np.arange(length)]
    return Vectors(matrix, reasons, length)


def check_vectors(values, article_ids, path: Path | None, column: str, length: int | None = None) -> Vectors:
    """read_vectors, where a bad vector is a one-line DataError naming the file, its row and column."""
    vectors = read_vectors(values, length)
    bad = vectors.bad
    if len(bad):
        row = int(bad[0])
        raise DataError(
            f"article '{article_ids[row]}': {vectors.reasons[row]} ({len(bad)} bad vector(s) in all)",
            path=path,
            row=row,
            column=column,
        )
    return vectors


def normalized(matrix: np.ndarray, normalize: str) -> np.ndarray:
    """l2: each row scaled to length 1 (a zero vector, which has no direction, stays zero); none: as it is."""
    if normalize == "none":
        return matrix
    norms = np.linalg.norm(matrix.astype(np.float64), axis=1, keepdims=True)
    return (matrix / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def fit_vector(matrix: np.ndarray, normalize: str, path: Path, column: str) -> dict:
    """The vocabulary entry of a vector attribute (its length, normalisation and scale), from the catalogue's
    vectors (`matrix`, NaN rows without); no vector at all is a DataError."""
    scaled = normalized(matrix, normalize)
    norms = np.linalg.norm(scaled.astype(np.float64), axis=1)
    norms = norms[np.isfinite(norms)]
    if not len(norms) or not matrix.shape[1]:
        raise DataError("no article of the catalogue has a vector", path=path, column=column)
    rms = float(np.sqrt(np.mean(norms**2)))
    return {"kind": VECTOR_KIND, "source": "article", "length": int(matrix.shape[1]), "normalize": normalize,
            "scale": 1.0 / rms if rms > 0 else 1.0}  # fmt: skip


def encode_vector(values, entry: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vectors (n, length) float32 as the model reads them, missing (n,), bad (n,): read as missing) of one
    vector attribute's raw values, by its vocabulary entry (fit_vector)."""
    vectors = read_vectors(values, entry["length"])
    matrix = (normalized(vectors.matrix, entry["normalize"]).astype(np.float64) * entry["scale"]).astype(np.float32)
    return matrix, vectors.missing, pd.notna(vectors.reasons)


def vector_array(matrix: np.ndarray) -> pa.Array:
    """(n, length) float32, NaN rows -> an Arrow list<float32> column, null where there is no vector."""
    missing = np.isnan(matrix).any(axis=1)
    offsets = np.concatenate([[0], np.cumsum(np.where(missing, 0, matrix.shape[1]))]).astype(np.int32)
    values = pa.array(matrix[~missing].ravel(), type=pa.float32())
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(missing))


# --- vectors derived from the catalogue's text -------------------------------------------------------------


def _words_of(rows, columns) -> list[list[str]]:
    """Each row's words (text_words) over `columns`, each word once; a column `rows` lacks gives none."""
    n = len(rows[next(iter(rows))]) if isinstance(rows, dict) and rows else len(rows)
    cells = [as_object_array(rows[c]) for c in columns if c in rows]
    return [list(dict.fromkeys(w for column in cells for w in text_words(column[i]))) for i in range(n)]


def _as_given(words: list[str]) -> list[str]:
    """The TF-IDF's analyzer: the documents are word lists already (text_words, each word once)."""
    return words


@dataclass(frozen=True)
class TextVectors:
    """A derived vector: x(a) = V tfidf(a), tfidf(a) the article's words' idf weights scaled to length 1 (each
    word once: text_words), V the truncated SVD's components. Its transform is written out here, in numpy, so
    that serving needs neither scikit-learn nor scipy, and gives what scikit-learn's transforms give."""

    columns: tuple[str, ...]
    words: tuple[str, ...]  # the vocabulary, in the components' column order
    idf: np.ndarray  # (V,) float64
    components: np.ndarray  # (length, V) float32

    @classmethod
    def fit(cls, articles: pd.DataFrame, columns, dim: int, min_count: int, path: Path, name: str) -> TextVectors:
        """Fitted on every row of `articles` (the catalogue); a word needs `min_count` articles."""
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        for column in columns:
            if column not in articles.columns:
                raise DataError(f"features.derived_vectors.{name} reads a column the articles table does not "
                                f"have; it has {sorted(articles.columns)}", path=path, column=column)  # fmt: skip
        documents = _words_of(articles, columns)
        tfidf = TfidfVectorizer(analyzer=_as_given, min_df=min_count)
        try:
            counts = tfidf.fit_transform(documents)
        except ValueError:  # no word on min_count articles
            raise DataError(f"features.derived_vectors.{name}: no word of {list(columns)} is on "
                            f"{min_count} articles or more (features.min_text_count)", path=path) from None  # fmt: skip
        n_components = min(dim, counts.shape[1], counts.shape[0])  # the SVD has at most this many
        # random_state fixed: the randomized SVD draws its projection, and the same catalogue must give the same
        # vectors (and data/features the same bytes) on every run
        svd = TruncatedSVD(n_components=n_components, random_state=0).fit(counts)
        words = tuple(str(w) for w in tfidf.get_feature_names_out())
        return cls(tuple(columns), words, tfidf.idf_.astype(np.float64), svd.components_.astype(np.float32))

    def transform(self, rows) -> np.ndarray:
        """(n, length) float32 vectors of `rows` (a frame, or its columns by name); a NaN row for an article
        without a word of the vocabulary: it has no vector, and reads the model's missing one."""
        index = {w: i for i, w in enumerate(self.words)}
        documents = _words_of(rows, self.columns)
        known = [[index[w] for w in words if w in index] for words in documents]
        out = np.full((len(known), self.components.shape[0]), np.nan, dtype=np.float32)
        lengths = np.fromiter((len(k) for k in known), np.int64, len(known))
        if not lengths.any():
            return out
        columns = np.fromiter((i for k in known for i in k), np.int64, int(lengths.sum()))
        rows_of = np.repeat(np.arange(len(known)), lengths)
        weights = self.idf[columns]
        weights = weights / np.sqrt(np.bincount(rows_of, weights**2, minlength=len(known)))[rows_of]
        # x = sum over the article's words of weight * component column; summed per article, in order
        terms = weights[:, None] * self.components.T[columns].astype(np.float64)
        starts = np.cumsum(lengths) - lengths
        has = lengths > 0
        out[has] = np.add.reduceat(terms, starts[has], axis=0).astype(np.float32)
        return out

    def table(self, name: str) -> pa.Table:
        """One row per word (attribute, word, idf, its column of the components): DERIVED_VECTORS_FILE's."""
        return pa.table({
            "attribute": pa.array([name] * len(self.words), pa.string()),
            "word": pa.array(self.words, pa.string()),
            "idf": pa.array(self.idf, pa.float64()),
            "weights": vector_array(np.ascontiguousarray(self.components.T)),
        })  # fmt: skip

    @classmethod
    def from_table(cls, table: pa.Table, name: str, columns) -> TextVectors:
        rows = table.filter(pc.equal(table.column("attribute"), name))
        weights = read_vectors(rows.column("weights")).matrix
        return cls(tuple(columns), tuple(rows.column("word").to_pylist()),
                   rows.column("idf").to_numpy().astype(np.float64), np.ascontiguousarray(weights.T))  # fmt: skip
