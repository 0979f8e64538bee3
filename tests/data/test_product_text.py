"""Product text as an article attribute (kind text): its words, the train-fit vocabulary, unseen words, and the
mean of the words' embeddings in the attribute models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from contextual_bert.config import FeaturesConfig
from contextual_bert.data.encoding import text_words
from contextual_bert.data.feature_spec import MISSING_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX, ContextSpec
from contextual_bert.data.fitting import fit_feature
from contextual_bert.data.vocabularies import ContextIndexer
from contextual_bert.model import ArticleAttributes, TextEmbedding


@pytest.mark.parametrize(
    "text, words",
    [
        ("Slim-fit Jeans, ÉCRU & the Crème", ["slim", "fit", "jeans", "ecru", "creme"]),
        ("JEANS jeans  Jeans.", ["jeans"]),
        ("a 5-pocket pair of jeans with a zip", ["pocket", "pair", "jeans", "zip"]),  # one-letter words dropped
        ("", []),
        (None, []),
        (float("nan"), []),
        ("the and of", []),
    ],
)
def test_text_words_fold_case_accents_punctuation_and_stop_words(text, words):
    assert text_words(text) == words


def fitted(values, **settings):
    cfg = FeaturesConfig(**settings)
    feature, entry = fit_feature(
        "description", "text", "article", np.asarray(values, dtype=object), cfg, 8, cfg.min_context_count
    )
    return feature, ContextIndexer(ContextSpec((feature,)), {"description": entry})


def test_the_vocabulary_keeps_words_on_enough_train_articles_and_unseen_words_are_unknown():
    train = ["Black slim jeans", "black skinny jeans", "Blue jeans", "red dress", None]
    feature, indexer = fitted(train, min_text_count=2)
    assert indexer.vocab["description"]["values"] == ["black", "jeans"]  # on 2+ articles; slim, blue... on one
    assert feature.kind == "text" and feature.cardinality == N_SPECIAL + 2 and feature.max_values == 3
    index = {w: N_SPECIAL + i for i, w in enumerate(indexer.vocab["description"]["values"])}
    encoded, missing, unknown = indexer.encode_feature(
        feature, np.array(["JEANS, black!", "velvet jeans", None, "the"], dtype=object)
    )
    assert encoded[0].tolist() == [index["jeans"], index["black"], PAD_INDEX]
    assert encoded[1].tolist() == [UNKNOWN_INDEX, index["jeans"], PAD_INDEX]  # velvet: not fitted
    assert encoded[2, 0] == MISSING_INDEX and encoded[3, 0] == MISSING_INDEX and missing.tolist()[2:] == [True, True]
    assert unknown.tolist() == [False, True, False, False]


def test_an_article_keeps_its_first_max_text_words_distinct_words():
    text = " ".join(f"word{i}" for i in range(10))
    feature, indexer = fitted([text, text], min_text_count=1, max_text_words=4)
    assert feature.max_values == 4
    encoded, _, _ = indexer.encode_feature(feature, np.array([text], dtype=object))
    assert [indexer.vocab["description"]["values"][i - N_SPECIAL] for i in encoded[0]] == [
        "word0",
        "word1",
        "word2",
        "word3",
    ]


def test_an_articles_text_vector_is_the_mean_of_its_words_embeddings():
    feature, indexer = fitted(["black jeans", "black dress", "blue jeans", "blue dress"], min_text_count=1)
    torch.manual_seed(0)
    attributes = ArticleAttributes(ContextSpec((feature,)), n_ids=N_SPECIAL, d_model=8)
    table = attributes.embeddings[0]
    assert isinstance(table, TextEmbedding)
    encoded, _, _ = indexer.encode_feature(feature, np.array(["Black jeans", "blue", None, "unheard"], dtype=object))
    catalogue = np.concatenate([np.full((N_SPECIAL, feature.max_values), PAD_INDEX), encoded])
    attributes.set_catalogue({"description": torch.from_numpy(catalogue)})
    ids = torch.nn.Embedding(N_SPECIAL, 8)
    vectors = attributes(ids)
    rows = table.weight.detach()
    words = lambda i: torch.from_numpy(encoded[i][encoded[i] != PAD_INDEX])  # noqa: E731
    for i in range(4):
        expected = (ids.weight[UNKNOWN_INDEX] + rows[words(i)].mean(dim=0)) * attributes.scale
        torch.testing.assert_close(vectors[N_SPECIAL + i], expected)
    assert words(2).tolist() == [MISSING_INDEX] and words(3).tolist() == [UNKNOWN_INDEX]


def test_the_outfit_offsets_leave_text_attributes_out():
    from contextual_bert.config import ModelConfig
    from contextual_bert.data.feature_spec import FeatureSpec
    from contextual_bert.model import AttributeOverlap, build_model

    text, _ = fitted(["black jeans", "black dress"], min_text_count=1)
    spec = ContextSpec((FeatureSpec("product_type", "categorical", "article", N_SPECIAL + 2, 8), text))
    model = build_model(
        ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=16), "none_attrs", 10, ContextSpec(()), spec
    )
    overlap = model.reader(AttributeOverlap)
    assert [f.name for f in overlap.spec.features] == ["product_type"] and len(overlap.offsets) == 1
    only_text = build_model(
        ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=16), "none_attrs", 10, ContextSpec(()), ContextSpec((text,))
    )
    assert only_text.reader(AttributeOverlap) is None
