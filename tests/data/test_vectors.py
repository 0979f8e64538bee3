"""Article vectors (attribute kind `vector`, data/vectors.py): read from a column of the articles table, checked,
normalised, derived from the catalogue's text, stored in the catalogue and encoded again at serving."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from feature_data import paper_cfg, paper_tables, write_validated

from contextual_bert.data.contract import PAPER_SCHEMA, DataSchema
from contextual_bert.data.encoding import text_words
from contextual_bert.data.feature_spec import N_SPECIAL
from contextual_bert.data.feature_store import DERIVED_VECTORS_FILE, load_catalogue
from contextual_bert.data.features import build_features
from contextual_bert.data.vectors import NOT_A_LIST, NOT_FINITE, TextVectors, read_vectors
from contextual_bert.errors import DataError

SCHEMA = DataSchema("synthetic", PAPER_SCHEMA.context_columns)
LENGTH = 6


def tables_with_vectors(seed: int = 0):
    """The paper's small tables, each article with a `clip` vector (one without) and a description; two articles
    that no outfit holds (never bought)."""
    articles, customers, outfits = paper_tables(n_outfits=600)
    rng = np.random.default_rng(seed)
    never = articles.iloc[:2].assign(article_id=["unbought-1", "unbought-2"])
    articles = pd.concat([articles, never], ignore_index=True)
    articles["clip"] = [rng.normal(size=LENGTH).astype(np.float32) * 3 for _ in range(len(articles))]
    articles.loc[7, "clip"] = None  # an article without a vector
    articles["desc"] = [f"{t} in {c} {s} cotton" for t, c, s in zip(articles.product_type, articles.color,
                                                                     articles["style"])]  # fmt: skip
    articles.loc[len(articles) - 2 :, "desc"] = ["linen skirt never bought", "linen trousers never bought"]
    return articles, customers, outfits


def build(tmp_path, articles, customers, outfits, **settings):
    validated = write_validated(tmp_path / "validated", SCHEMA, articles, customers, outfits)
    attributes = settings.pop("attributes", {"product_type": "categorical", "clip": "vector"})
    cfg = paper_cfg(article_features=True, article_attributes={"synthetic": attributes}, **settings)
    manifest = build_features(validated, tmp_path / "features", cfg, max_set_size=8)
    return manifest, load_catalogue(tmp_path / "features")


def row_of(catalogue, article_id: str) -> int:
    return catalogue.vocab.ids.index(article_id)


def test_vectors_are_read_from_any_list_column_form():
    arrow = pa.array([[1.0, 2.0], None, [3.0, 4.0]], pa.list_(pa.float32()))
    fixed = pa.array([[1, 2], None, [3, 4]], pa.list_(pa.int64(), 2))
    cells = pd.Series([np.array([1.0, 2.0]), None, [3, 4]], dtype=object)
    text = pd.Series(["[1.0, 2.0]", "", "[3, 4]"], dtype=object)  # a CSV's list
    for values in (arrow, fixed, cells, text, pa.chunked_array([arrow])):
        vectors = read_vectors(values)
        assert vectors.length == 2 and vectors.bad.tolist() == []
        np.testing.assert_array_equal(vectors.matrix[[0, 2]], [[1, 2], [3, 4]])
        assert vectors.missing.tolist() == [False, True, False]


def test_bad_vectors_have_their_reason_and_read_as_none():
    values = pd.Series([[1.0, 2.0], [1.0, 2.0, 3.0], [np.nan, 1.0], [np.inf, 1.0], "blue", [], [5.0, 6.0]])
    vectors = read_vectors(values)
    assert vectors.length == 2  # the length most vectors have
    assert vectors.reasons.tolist() == [
        None, "3 values, not 2 as the other vectors", NOT_FINITE, NOT_FINITE, NOT_A_LIST, None, None,
    ]  # fmt: skip
    assert vectors.missing.tolist() == [False, True, True, True, True, True, False]
    assert read_vectors(pa.array([[1.0, None]], pa.list_(pa.float64()))).reasons.tolist() == [NOT_FINITE]


@pytest.mark.parametrize(
    "bad, message",
    [
        ([1.0, 2.0], r"article 'a0005': 2 values, not 6 as the other vectors \(1 bad vector"),
        ([np.nan] * LENGTH, "article 'a0005': a missing, NaN or infinite value"),
        ([1.0] * (LENGTH - 1) + [np.inf], "article 'a0005': a missing, NaN or infinite value"),
        ("red", "article 'a0005': not a list of numbers"),
    ],
)
def test_a_bad_vector_in_the_articles_table_is_a_one_line_error_naming_file_row_and_column(tmp_path, bad, message):
    articles, customers, outfits = tables_with_vectors()
    if isinstance(bad, str):  # the column as a CSV holds lists: JSON text
        articles["clip"] = [None if v is None else json.dumps(v.tolist()) for v in articles["clip"]]
        articles.at[5, "clip"] = bad
    else:
        articles.at[5, "clip"] = np.asarray(bad, dtype=np.float32)
    with pytest.raises(DataError, match=rf"articles.parquet, row 5, column 'clip': {message}") as error:
        build(tmp_path, articles, customers, outfits)
    assert "\n" not in str(error.value)


def test_an_article_without_a_vector_is_kept_and_counted(tmp_path):
    articles, customers, outfits = tables_with_vectors()
    manifest, catalogue = build(tmp_path, articles, customers, outfits)
    assert manifest["catalogue"]["missing"]["clip"] == 1  # a0007, in the features report
    assert manifest["catalogue"]["articles"] == len(articles)  # none dropped
    vectors = catalogue.attributes["clip"]
    assert vectors.dtype == np.float32 and vectors.shape == (len(catalogue), LENGTH)
    assert np.isnan(vectors[row_of(catalogue, "a0007")]).all() and np.isnan(vectors[:N_SPECIAL]).all()
    assert not np.isnan(np.delete(vectors, [0, 1, 2, row_of(catalogue, "a0007")], axis=0)).any()
    spec = {f.name: f for f in catalogue.spec.features}["clip"]
    assert (spec.kind, spec.max_values, spec.cardinality) == ("vector", LENGTH, 0)
    assert manifest["params"]["article_attributes"]["synthetic"]["clip"] == "vector"


def test_vectors_keep_their_direction_and_are_scaled_to_a_root_mean_square_length_of_one(tmp_path):
    articles, customers, outfits = tables_with_vectors()
    _, catalogue = build(tmp_path, articles, customers, outfits)
    stored = catalogue.attributes["clip"]
    rows = [row_of(catalogue, a) for a in articles["article_id"] if a != "a0007"]
    raw = np.stack([articles.set_index("article_id").at[a, "clip"] for a in articles["article_id"] if a != "a0007"])
    lengths = np.linalg.norm(stored[rows].astype(np.float64), axis=1)
    assert np.sqrt(np.mean(lengths**2)) == pytest.approx(1.0, abs=1e-5)
    scale = stored[rows] / raw  # one number for every value of every vector
    np.testing.assert_allclose(scale, scale[0, 0], rtol=1e-5)


def test_l2_normalisation_gives_every_vector_length_one_and_serving_the_same(tmp_path):
    articles, customers, outfits = tables_with_vectors()
    articles.at[11, "clip"] = articles.at[11, "clip"] * 100  # its length no longer counts
    _, catalogue = build(tmp_path, articles, customers, outfits, vector_normalize={"clip": "l2"})
    stored = catalogue.attributes["clip"]
    present = ~np.isnan(stored).any(axis=1)
    np.testing.assert_allclose(np.linalg.norm(stored[present], axis=1), 1.0, rtol=1e-6)
    assert catalogue.indexer.vocab["clip"]["normalize"] == "l2"
    # an article added at serving is encoded by the same rule
    new = pd.DataFrame({"article_id": ["fresh"], "product_type": ["top"], "clip": [[3.0, 0, 0, 4.0, 0, 0]]})
    extended = catalogue.extend(new)
    np.testing.assert_allclose(extended.attributes["clip"][-1], [0.6, 0, 0, 0.8, 0, 0], rtol=1e-6)


def test_a_bad_vector_in_a_catalogue_added_at_serving_is_a_one_line_error(tmp_path):
    articles, customers, outfits = tables_with_vectors()
    _, catalogue = build(tmp_path, articles, customers, outfits)
    new = pd.DataFrame({"article_id": ["ok", "short"], "clip": [[1.0] * LENGTH, [1.0, 2.0]]})
    with pytest.raises(DataError, match=r"new.parquet, row 1, column 'clip': article 'short': 2 values, not 6"):
        catalogue.extend(new, tmp_path / "new.parquet")


def test_a_derived_text_vector_ranks_an_article_never_bought(tmp_path):
    articles, customers, outfits = tables_with_vectors()
    attributes = {"product_type": "categorical", "text": "vector"}
    derived = {"text": {"columns": ["desc", "color"], "dim": 4}}
    manifest, catalogue = build(tmp_path, articles, customers, outfits, attributes=attributes, derived_vectors=derived)
    vectors = catalogue.attributes["text"]
    never = row_of(catalogue, "unbought-2")
    assert never >= catalogue.n_ids  # no id embedding: known by its attributes only
    assert vectors.shape[1] == 4 and np.isfinite(vectors[never]).all()
    # fitted on the whole catalogue: a word only the articles never bought have ("linen") is in the vocabulary
    text = catalogue.indexer.derived["text"]
    assert "linen" in text.words and (tmp_path / "features" / DERIVED_VECTORS_FILE).is_file()
    assert manifest["catalogue"]["missing"]["text"] == 0
    # the transform is scikit-learn's TF-IDF + SVD, written out (serving needs neither)
    from sklearn.feature_extraction.text import TfidfVectorizer

    words = [list(dict.fromkeys(text_words(d) + text_words(c))) for d, c in zip(articles["desc"], articles["color"])]
    tfidf = TfidfVectorizer(analyzer=lambda w: w, min_df=2).fit(words)
    assert list(tfidf.get_feature_names_out()) == list(text.words)
    expected = tfidf.transform(words) @ text.components.T.astype(np.float64)
    np.testing.assert_allclose(text.transform(articles), expected, rtol=1e-5, atol=1e-6)
    # a new article at serving is encoded from its text, by the same words and weights as the catalogue's
    loaded = load_catalogue(tmp_path / "features")
    new = pd.DataFrame({"article_id": ["fresh", "mute"], "desc": ["linen trousers", "zzz"], "color": ["red", None]})
    extended = loaded.extend(new)
    same = extended.extend(articles.iloc[[len(articles) - 1]].assign(article_id="again"))
    np.testing.assert_allclose(same.attributes["text"][-1], vectors[never], rtol=1e-6)
    assert np.isfinite(extended.attributes["text"][-2]).all()
    assert np.isnan(extended.attributes["text"][-1]).all()  # no word it knows: no vector, the missing one


def test_the_derived_vectors_are_the_same_on_every_run(tmp_path):
    articles, customers, outfits = tables_with_vectors()
    attributes, derived = {"text": "vector"}, {"text": {"columns": ["desc"], "dim": 3}}
    for run in ("a", "b"):
        build(tmp_path / run, articles, customers, outfits, attributes=attributes, derived_vectors=derived)
    for name in ("catalogue.parquet", "article_attributes.json", DERIVED_VECTORS_FILE, "manifest.json"):
        assert (tmp_path / "a" / "features" / name).read_bytes() == (tmp_path / "b" / "features" / name).read_bytes()


def test_a_derived_vector_of_a_column_the_table_lacks_or_clashing_with_one_is_an_error(tmp_path):
    articles, customers, outfits = tables_with_vectors()
    with pytest.raises(DataError, match=r"column 'summary': features.derived_vectors.text reads a column"):
        build(tmp_path / "a", articles, customers, outfits, attributes={"text": "vector"},
              derived_vectors={"text": {"columns": ["summary"]}})  # fmt: skip
    with pytest.raises(DataError, match=r"column 'desc': features.derived_vectors.desc is also a column"):
        build(tmp_path / "b", articles, customers, outfits, attributes={"desc": "vector"},
              derived_vectors={"desc": {"columns": ["color"]}})  # fmt: skip


def test_a_source_list_float32_column_is_read_as_a_vector(tmp_path):
    # as the planted source may write `style_vector`: a Parquet list<float32> column of the articles table
    articles, customers, outfits = tables_with_vectors()
    validated = write_validated(tmp_path / "validated", SCHEMA, articles.drop(columns=["clip"]), customers, outfits)
    table = pq.read_table(validated / "articles.parquet")
    style = pa.array([[float(i), 1.0, -1.0] for i in range(table.num_rows)], pa.list_(pa.float32()))
    pq.write_table(table.append_column("style_vector", style), validated / "articles.parquet")
    cfg = paper_cfg(article_features=True, article_attributes={"synthetic": {"style_vector": "vector"}})
    manifest = build_features(validated, tmp_path / "features", cfg, max_set_size=8)
    spec = {f["name"]: f for f in manifest["catalogue"]["spec"]}
    assert spec["style_vector"]["kind"] == "vector" and spec["style_vector"]["max_values"] == 3
    catalogue = load_catalogue(tmp_path / "features")
    a = catalogue.attributes["style_vector"][row_of(catalogue, "a0004")]
    assert a[1] == pytest.approx(-a[2]) and a[0] == pytest.approx(4 * a[1])
    assert (
        json.loads((tmp_path / "features" / "article_attributes.json").read_text())["vocab"]["style_vector"]["length"]
        == 3
    )


def test_text_vectors_round_trip_through_their_table():
    frame = pd.DataFrame({"desc": ["red cotton top", "blue cotton top", "red linen skirt", "blue linen skirt"]})
    text = TextVectors.fit(frame, ["desc"], 2, 2, None, "text")
    again = TextVectors.from_table(text.table("text"), "text", ["desc"])
    np.testing.assert_array_equal(again.transform(frame), text.transform(frame))
