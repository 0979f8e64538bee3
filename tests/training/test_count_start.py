"""The sparse-data recipe: the count as a model's starting point (training/count_start.py), where a model started
from the counts scores as the popularity yardstick, with a history as popularity + own history; and the rare ids'
decay (training/regularisers.RareIdDecay)."""

import numpy as np
import pytest
import torch
from feature_data import paper_cfg, write_validated
from test_history import dated_tables

from contextual_bert.config import HistoryConfig, ModelConfig
from contextual_bert.data.contract import PAPER_SCHEMA
from contextual_bert.data.feature_spec import (
    HISTORY_FEATURE,
    MASK_INDEX,
    N_SPECIAL,
    UNKNOWN_INDEX,
    ContextSpec,
    FeatureSpec,
)
from contextual_bert.data.feature_store import load_article_vocab, load_spec, load_split
from contextual_bert.data.features import build_features
from contextual_bert.evaluation.counts import HistoryPopularityModel, PopularityModel
from contextual_bert.evaluation.ranking import case_ranks
from contextual_bert.model import HistoryRepeat, build_model
from contextual_bert.training.count_start import log_popularity, start_from_counts
from contextual_bert.training.regularisers import RareIdDecay

SMALL = ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=32)


@pytest.fixture(scope="module")
def dated(tmp_path_factory):
    root = tmp_path_factory.mktemp("count_start")
    validated = write_validated(root / "validated", PAPER_SCHEMA, *dated_tables())
    cfg = paper_cfg(min_article_count=2, split="time", history=HistoryConfig(enabled=True, max_items=12))
    build_features(validated, root / "features", cfg, max_set_size=8)
    return root / "features"


def test_log_popularity_is_the_yardsticks_softmax_and_unk_a_count_of_zero():
    items = torch.tensor([[3, 4, 4, 0], [4, 5, 2, 0]])
    log_p = log_popularity(items, 7).exp()
    # counts + 1 over the real ids 3..6: 2, 4, 2, 1 of 9
    np.testing.assert_allclose(log_p[3:].numpy(), np.array([2, 4, 2, 1]) / 9, rtol=1e-12)
    assert log_p[2] == pytest.approx(1 / 9)  # [UNK]: a count of 0, the bias of an article without an id


@pytest.mark.parametrize("variant", ["none", "global_state", "bag_of_items_context"])
def test_a_model_started_from_the_counts_scores_as_its_yardstick(dated, variant):
    spec, counts = load_spec(dated), np.asarray(load_article_vocab(dated).counts)
    train, test = load_split(dated, "train", 8), load_split(dated, "test", 8)
    torch.manual_seed(0)
    model = build_model(SMALL, variant, len(counts), spec)
    start_from_counts(model, train.items)
    torch.testing.assert_close(model.output_bias.detach(), log_popularity(train.items, len(counts)).float())
    with torch.no_grad():  # the learned scores at zero: what is left is the count
        if hasattr(model, "head_transform"):
            model.head_transform.weight.zero_()
            model.head_transform.bias.zero_()
        else:
            model.output_embeddings.weight.zero_()
    reads_history = model.reader(HistoryRepeat) is not None
    # (PopularityModel's logits, log(1 + count), are the same softmax as log_popularity's)
    yardstick = HistoryPopularityModel(counts, HistoryRepeat.START_WEIGHT) if reads_history else PopularityModel(counts)
    started = case_ranks(model, test, 64, "cpu", with_ranks=False)["log_prob"]
    expected = case_ranks(yardstick, test, 64, "cpu", with_ranks=False)["log_prob"]
    np.testing.assert_allclose(started, expected, atol=2e-5, rtol=0)
    assert reads_history == (variant != "none")


@pytest.mark.parametrize("variant", ["global_state", "bag_of_items"])
def test_rare_id_decay_shrinks_each_id_row_by_its_count_and_leaves_the_specials(variant):
    spec = ContextSpec((FeatureSpec("c", "categorical", "customer", 5, 8),))
    model = build_model(SMALL, variant, 8, spec)
    items = torch.tensor([[3, 4, 4, 4, 4, 5], [3, 2, 1, 0, 0, 0]])  # counts: 3 twice, 4 four times, 5 once, 6-7 never
    tables = [model.item_embeddings.weight] + ([model.output_embeddings.weight] if variant == "bag_of_items" else [])
    before = [t.detach().clone() for t in tables]
    RareIdDecay(model, items, strength=5.0).step(learning_rate=0.01)
    factor = torch.tensor([1, 1, 1, 1 - 0.05 / 4, 1 - 0.05 / 16, 1 - 0.05, 1 - 0.05, 1 - 0.05])[:, None]  # lr s / n^2
    for weight, old in zip(tables, before):
        torch.testing.assert_close(weight.detach(), old * factor)


def test_an_attrs_models_history_article_without_an_id_is_repeated_at_the_unk_rows_bias():
    from test_ranking_passes import N_CATALOGUE, SINGLE, attribute_model, outfits

    model = attribute_model("global_state", SINGLE, history=True)
    data = outfits(16, history=True)
    history = data.context[HISTORY_FEATURE].clone()
    history[:, 0] = N_CATALOGUE - 1  # a catalogue article without an id embedding
    context = {**data.context, HISTORY_FEATURE: history}
    items = data.items.clone()
    items[:, 0] = MASK_INDEX
    with torch.no_grad():
        model.output_bias[UNKNOWN_INDEX] = -3.0
        logits = model.masked_logits(items, context)  # an index beyond the id rows once failed here
        _, gain = model.reader(HistoryRepeat).gains(model, items == MASK_INDEX, context)
    n = (history >= N_SPECIAL).sum(dim=1).float()
    repeat = model.reader(HistoryRepeat)
    log_lambda = repeat.LOG_LAMBDA + 10.0 * (repeat.weight[0] + repeat.weight[1] * n.log()) - n.log()
    torch.testing.assert_close(gain[:, 0], torch.nn.functional.softplus(log_lambda + 3.0).detach())
    assert torch.isfinite(logits[:, N_SPECIAL:]).all()


# --- an "_attrs" model starts at the attribute-aware popularity (its yardstick) ---------------------------------

TYPES = ContextSpec((FeatureSpec("product_type", "categorical", "article", N_SPECIAL + 3, 8),))
ATTRS_IDS = N_SPECIAL + 6  # articles with an id; two more of the catalogue have none


def attrs_count_model(variant: str = "none_attrs"):
    """An "_attrs" model over 8 articles of 3 types (two without an id) and the count it starts from."""
    from contextual_bert.evaluation.counts import AttributePopularityModel

    torch.manual_seed(0)
    model = build_model(
        SMALL.model_copy(update={"attribute_overlap": False}), variant, ATTRS_IDS, ContextSpec(()), TYPES
    )
    values = torch.tensor([0] * N_SPECIAL + [3, 3, 4, 4, 5, 5, 3, 5])  # the last two: no id
    counts = np.array([0] * N_SPECIAL + [5, 1, 2, 2, 1, 3, 0, 0])
    model.set_catalogue({"product_type": values})
    return model, AttributePopularityModel(values.numpy(), counts, ATTRS_IDS, 0.0, attribute="product_type")


def zero_learned_scores(model) -> None:
    with torch.no_grad():
        model.head_transform.weight.zero_()
        model.head_transform.bias.zero_()


def test_an_attrs_model_started_from_its_count_scores_every_article_as_the_count_does():
    model, count = attrs_count_model()
    assert start_from_counts(model, torch.tensor([[N_SPECIAL, N_SPECIAL + 1]]), count) == "popularity_attribute"
    assert torch.equal(model.output_bias.detach(), torch.zeros_like(model.output_bias))  # the bias left at 0
    zero_learned_scores(model)
    model.eval()
    with torch.no_grad():
        _, bias = model.output_layer()
    expected = count.log_prior()[N_SPECIAL:]
    torch.testing.assert_close(bias[N_SPECIAL:].log_softmax(0), expected, atol=1e-6, rtol=0)
    assert float(expected.exp().sum()) == pytest.approx(1.0, abs=1e-6)  # the count's P(a) with no outfit
    # a dropped id keeps its article's count: the bias of a row read as [UNK] in training is its own prior
    model.train()
    rows = torch.arange(N_SPECIAL, ATTRS_IDS + 2)
    ids = torch.full_like(rows, UNKNOWN_INDEX)
    torch.testing.assert_close(model.attributes.bias(model.output_bias, ids, rows), count.log_prior()[rows])


def test_a_larger_catalogue_spreads_a_types_new_article_mass_and_a_checkpoint_keeps_the_prior(tmp_path):
    from contextual_bert.model.checkpoint import model_from_payload, model_payload

    model, count = attrs_count_model()
    start_from_counts(model, torch.tensor([[N_SPECIAL]]), count)
    before = model.attributes.prior_rows.clone()
    loaded = model_from_payload(model_payload(model))
    torch.testing.assert_close(loaded.attributes.prior_rows, before)
    # two more articles without an id, of the first type: its new articles' mass is now shared by three
    values = torch.tensor([0] * N_SPECIAL + [3, 3, 4, 4, 5, 5, 3, 5, 3, 3])
    loaded.set_catalogue({"product_type": values})
    rows = loaded.attributes.prior_rows
    torch.testing.assert_close(rows[: ATTRS_IDS + 2][:-2], before[:-2])  # the articles with an id keep theirs
    first_type_new = rows[[ATTRS_IDS, ATTRS_IDS + 2, ATTRS_IDS + 3]]
    torch.testing.assert_close(first_type_new.exp().sum(), before[ATTRS_IDS].exp())
    torch.testing.assert_close(rows[ATTRS_IDS + 1], before[ATTRS_IDS + 1])  # the other type's new article


def test_the_count_prior_must_name_a_single_valued_attribute():
    model, count = attrs_count_model()
    count.attribute = "colour"
    with pytest.raises(Exception, match="colour"):
        start_from_counts(model, torch.tensor([[N_SPECIAL]]), count)


def test_a_training_started_from_the_attribute_count_says_so_and_its_checkpoint_keeps_the_prior(tmp_path):
    from helpers import PLAIN_TRAIN

    from contextual_bert.config import TrainConfig
    from contextual_bert.data.feature_spec import PAD_INDEX, EncodedOutfits
    from contextual_bert.model import load_checkpoint
    from contextual_bert.training import fit

    def outfits(n: int, seed: int, top: int) -> EncodedOutfits:
        g = torch.Generator().manual_seed(seed)
        items = torch.full((n, 4), PAD_INDEX, dtype=torch.long)
        items[:, :3] = N_SPECIAL + torch.rand(n, top - N_SPECIAL, generator=g).argsort(dim=1)[:, :3]
        return EncodedOutfits(items, {})

    model, count = attrs_count_model()
    cfg = TrainConfig(batch_size=16, max_epochs=2, lr_warmup_steps=2, device="cpu", id_dropout=0.3, init_output="counts",
                      rare_id_decay=0.0, **PLAIN_TRAIN)  # fmt: skip
    metrics = fit(
        model, outfits(64, 0, ATTRS_IDS), outfits(16, 1, ATTRS_IDS + 2), cfg, tmp_path, 0, attribute_count=count
    )
    assert metrics["count_start"] == "popularity_attribute"
    loaded, _ = load_checkpoint(tmp_path / "checkpoint.pt")
    torch.testing.assert_close(loaded.attributes.prior_rows, model.attributes.prior_rows)
    assert loaded.attributes.count_prior["unseen_share"] == count.unseen_share
