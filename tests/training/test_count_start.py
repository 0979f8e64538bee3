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


@pytest.mark.parametrize("model_name", ["none", "global_state", "bag_of_items_context"])
def test_a_model_started_from_the_counts_scores_as_its_yardstick(dated, model_name):
    spec, counts = load_spec(dated), np.asarray(load_article_vocab(dated).counts)
    train, test = load_split(dated, "train", 8), load_split(dated, "test", 8)
    torch.manual_seed(0)
    model = build_model(SMALL, model_name, len(counts), spec)
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
    assert reads_history == (model_name != "none")


@pytest.mark.parametrize("model_name", ["global_state", "bag_of_items"])
def test_rare_id_decay_shrinks_each_id_row_by_its_count_and_leaves_the_specials(model_name):
    spec = ContextSpec((FeatureSpec("c", "categorical", "customer", 5, 8),))
    model = build_model(SMALL, model_name, 8, spec)
    items = torch.tensor([[3, 4, 4, 4, 4, 5], [3, 2, 1, 0, 0, 0]])  # counts: 3 twice, 4 four times, 5 once, 6-7 never
    tables = [model.item_embeddings.weight] + ([model.output_embeddings.weight] if model_name == "bag_of_items" else [])
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
