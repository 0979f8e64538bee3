"""The feature store: reading data/features back (load_split) and encoding raw values as the stage did."""

import numpy as np
import pandas as pd
import pytest
import torch
from feature_data import build_paper_features

from contextual_bert.data.encoding import SMALL_FRAME_ROWS
from contextual_bert.data.feature_spec import (
    MASK_INDEX,
    MISSING_INDEX,
    N_SPECIAL,
    PAD_INDEX,
    UNKNOWN_INDEX,
    ContextSpec,
)
from contextual_bert.data.feature_store import load_article_vocab, load_context_indexer, load_split
from contextual_bert.data.outfit_encoder import OutfitEncoder
from contextual_bert.data.vocabularies import ArticleVocab, ContextIndexer
from contextual_bert.errors import ContextualBertError, DataError


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    return build_paper_features(tmp_path_factory.mktemp("paper"))


def test_load_split_round_trip_matches_the_tables(paper):
    features_dir, _, (_, customers, outfits) = paper
    vocab = load_article_vocab(features_dir)
    split = load_split(features_dir, "val", max_set_size=8)
    raw = outfits.set_index("outfit_id").loc[split.outfit_ids]
    assert split.items.shape == (len(split), 8) and split.items.dtype.is_floating_point is False
    for row, article_ids in enumerate(raw["article_ids"]):
        expected, _ = vocab.to_indices(article_ids)
        assert split.items[row, : len(article_ids)].tolist() == expected.tolist()
        assert (split.items[row, len(article_ids) :] == PAD_INDEX).all()
    stored_customers = pd.read_parquet(features_dir / "customers.parquet").set_index("customer_id")
    expected_country = stored_customers.loc[raw["customer_id"], "country"].to_numpy()
    np.testing.assert_array_equal(split.context["country"].numpy(), expected_country)
    assert split.context["preferred_brands"].shape == (len(split), 8)
    assert split.context["occasion"].shape == (len(split),)
    known = set(vocab.ids[N_SPECIAL:])
    first = list(raw["article_ids"].iloc[0])
    assert vocab.to_ids(split.items[0, : len(first)]) == [a if a in known else "[UNK]" for a in first]


def test_context_indexer_matches_training_rows_and_reports_unknowns(paper):
    features_dir, _, (_, customers, outfits) = paper
    encoder = load_context_indexer(features_dir)
    split = load_split(features_dir, "test", max_set_size=8)
    raw = outfits.set_index("outfit_id").loc[split.outfit_ids].reset_index()
    rows = raw[["customer_id", "occasion"]].merge(customers, on="customer_id", how="left")
    tensors, reports = encoder.encode(rows)
    assert set(tensors) == set(split.context)
    for name, stored in split.context.items():
        assert tensors[name].dtype == stored.dtype
        assert (tensors[name] == stored).all(), name

    request = pd.DataFrame(
        {
            "age": [34, None, "not a number"],
            "gender": ["f", "martian", None],
            "preferred_brands": [["brand_1", "no-such-brand"], "brand_2", []],
            "occasion": ["work", "wedding", None],
        }
    )
    tensors, reports = encoder.encode(request)
    assert tensors["gender"][1] == UNKNOWN_INDEX and tensors["gender"][2] == MISSING_INDEX
    assert tensors["age"].tolist()[1:] == [MISSING_INDEX, UNKNOWN_INDEX]
    assert tensors["preferred_brands"][0, :2].tolist()[1] == UNKNOWN_INDEX
    assert tensors["preferred_brands"][2, 0] == MISSING_INDEX
    assert tensors["country"].tolist() == [MISSING_INDEX] * 3  # column absent from the request
    assert set(reports[0]["unknown"]) == {"preferred_brands"}
    assert "country" in reports[0]["missing"] and "age" not in reports[0]["missing"]
    assert set(reports[1]["unknown"]) == {"gender", "occasion"}
    assert {"gender", "preferred_brands", "occasion"} <= set(reports[2]["missing"])
    assert reports[2]["unknown"] == ["age"]

    # a number is finite and not true/false: anything else is no age (a float column and an object column alike)
    for ages in ([np.inf, -np.inf, 34.0], [np.inf, True, "inf", 34]):
        tensors, reports = encoder.encode(pd.DataFrame({"age": ages}))
        n_odd = len(ages) - 1
        assert tensors["age"].tolist()[:n_odd] == [UNKNOWN_INDEX] * n_odd and tensors["age"][-1] >= N_SPECIAL
        assert [r["unknown"] for r in reports] == [["age"]] * n_odd + [[]]


def test_reading_features_that_are_not_there_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="spec.json.*contextual-bert features"):
        load_split(tmp_path, "train", 8)
    with pytest.raises(ContextualBertError, match="unknown split"):
        load_split(tmp_path, "holdout", 8)


def test_the_outfit_encoder_gives_whole_outfits_as_load_split_does(paper):
    features_dir, _, (_, customers, outfits) = paper
    stored = load_split(features_dir, "val", max_set_size=8)
    rows = (
        outfits.set_index("outfit_id")
        .loc[stored.outfit_ids]
        .reset_index()
        .merge(customers, on="customer_id", how="left")
    )
    encoded = OutfitEncoder.load(features_dir, max_set_size=8).encode(rows, with_mask=False, id_column="outfit_id")
    assert encoded.outfits.outfit_ids == stored.outfit_ids
    assert torch.equal(encoded.outfits.items, stored.items)
    for name, values in stored.context.items():
        assert torch.equal(encoded.outfits.context[name], values), name


def test_the_outfit_encoder_puts_a_mask_after_a_partial_outfit_and_reports_what_it_cannot_use(paper):
    features_dir, _, _ = paper
    encoder = OutfitEncoder.load(features_dir, max_set_size=8)
    vocab = encoder.article_vocab
    rows = pd.DataFrame(
        {
            "article_ids": [["a0000", "never-seen"], np.array(["a0001"]), ["a0002", "a0003", "a0004"]],
            "gender": ["f", None, "martian"],
        }
    )
    encoded = encoder.encode(rows, with_mask=True)
    items = encoded.outfits.items
    assert items.shape == (3, 8)
    assert items[0, :3].tolist() == [vocab.to_indices(["a0000"])[0][0], UNKNOWN_INDEX, MASK_INDEX]
    assert items[1, :2].tolist() == [vocab.to_indices(["a0001"])[0][0], MASK_INDEX]
    assert (items[2, 4:] == PAD_INDEX).all() and items[2, 3] == MASK_INDEX
    assert encoded.unknown_article_ids == [["never-seen"], [], []]
    assert "gender" in encoded.missing_features[1] and encoded.unknown_features[2] == ["gender"]
    with pytest.raises(
        ContextualBertError, match="row 0: 'article_ids' has 8 ids; an outfit to complete has at most 7"
    ):
        encoder.encode(pd.DataFrame({"article_ids": [[f"a{i:04d}" for i in range(8)]]}), with_mask=True)
    assert encoder.encode(pd.DataFrame({"article_ids": [[f"a{i:04d}" for i in range(8)]]}), with_mask=False)


def test_a_small_request_encodes_exactly_as_the_same_rows_in_a_large_one(paper):
    """A frame of up to SMALL_FRAME_ROWS rows is read in one object conversion, a larger one column by
    column (numeric columns stay numeric): both give the same tensors and reports, odd values included."""
    features_dir, _, (_, customers, outfits) = paper
    rows = (
        outfits.head(SMALL_FRAME_ROWS + 36).merge(customers, on="customer_id", how="left").drop(columns=["customer_id"])
    )
    rows["article_ids"] = [list(ids[:3]) for ids in rows["article_ids"]]
    rows.loc[0, "article_ids"] = ["a0000", "never-seen"]
    rows.loc[1, "gender"] = None
    rows.loc[2, "gender"] = "martian"
    rows.loc[3, "preferred_brands"] = "brand_2"  # a plain string: a one-value list
    rows.loc[4, "occasion"] = float("nan")
    rows["age"] = rows["age"].astype(float)
    rows.loc[5, "age"] = float("nan")
    encoder = OutfitEncoder.load(features_dir, max_set_size=8)
    large = encoder.encode(rows, with_mask=True)
    small = encoder.encode(rows.head(8), with_mask=True)
    assert torch.equal(small.outfits.items, large.outfits.items[:8])
    for name, values in small.outfits.context.items():
        assert torch.equal(values, large.outfits.context[name][:8]), name
    assert small.unknown_article_ids == large.unknown_article_ids[:8] == [["never-seen"]] + [[]] * 7
    assert small.missing_features == large.missing_features[:8]
    assert small.unknown_features == large.unknown_features[:8]
    assert "gender" in small.missing_features[1] and small.unknown_features[2] == ["gender"]
    assert "age" in small.missing_features[5] and "occasion" in small.missing_features[4]


def test_a_request_finds_an_id_written_as_a_number_or_with_spaces_and_nothing_else():
    """H&M ids are '0108775015'; a client's integer column or spreadsheet writes 108775015. Training and the
    features stage match ids as written; only request ids get the lenient lookup."""
    vocab = ArticleVocab(["[PAD]", "[MASK]", "[UNK]", "0108775015", "7", "07", "A1"], np.zeros(7, dtype=np.int64))
    spellings = [108775015, "108775015", " 0108775015 ", "108775015.0", " A1", "7", 7, "007", "x", "1087750150"]
    indices, unknown = vocab.to_indices(spellings, as_written=False)
    assert indices.tolist() == [3, 3, 3, 3, 6, 4, 4, UNKNOWN_INDEX, UNKNOWN_INDEX, UNKNOWN_INDEX]
    assert unknown == ["007", "x", "1087750150"]  # 7 and 07 share a value: '007' is neither
    assert vocab.to_indices([108775015, " A1"])[1] == ["108775015", " A1"]  # as written: unknown
    encoder = OutfitEncoder(vocab, ContextIndexer(ContextSpec(()), {}), max_set_size=8)
    encoded = encoder.encode(pd.DataFrame({"article_ids": [["A1"], [108775015, "A1", "zz"]]}), with_mask=True)
    assert encoded.outfits.items[1, :4].tolist() == [3, 6, UNKNOWN_INDEX, MASK_INDEX]
    assert encoded.unknown_article_ids == [[], ["zz"]]
    exact = encoder.encode(pd.DataFrame({"article_ids": [[108775015, "A1"]]}), with_mask=False, as_written=True)
    assert exact.unknown_article_ids == [["108775015"]]  # data (promotion) is matched as written
    with pytest.raises(ContextualBertError, match=r"row 1: article id '108775015' appears twice .*'0108775015'"):
        encoder.encode(pd.DataFrame({"article_ids": [["A1"], ["0108775015", 108775015]]}), with_mask=True)
