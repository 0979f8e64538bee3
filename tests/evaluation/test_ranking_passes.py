"""The passes that rank the whole catalogue (issue 58): the output layer built once per pass, the attribute
overlap's offsets expanded once per batch, and the outfit dependence's shuffled pass sharing the real outfit's
offsets, against the plain computation (as before: every batch builds the output layer, the offsets come from
one gather per value slot, and the shuffled pass takes the donor's offsets out again).

Bit for bit where the arithmetic is unchanged (every article with at most one value per attribute); within
1e-6 nats where only the order of operations changes (a multi-valued attribute's mean; the shuffled pass's
offsets, no longer added and taken out again)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import wake_between_blocks

from contextual_bert.config import FitbConfig, ModelConfig
from contextual_bert.data.feature_spec import (
    HISTORY_FEATURE,
    MASK_INDEX,
    N_SPECIAL,
    PAD_INDEX,
    UNKNOWN_INDEX,
    ContextSpec,
    EncodedOutfits,
    FeatureSpec,
)
from contextual_bert.evaluation import ranking
from contextual_bert.evaluation.counts import AttributePopularityModel, HistoryPopularityModel, PopularityModel
from contextual_bert.evaluation.fitb import PROTOCOLS, answer, make_questions
from contextual_bert.evaluation.ranking import case_ranks, donor_outfits, outfit_dependence
from contextual_bert.model import AttributeOverlap, HistoryRepeat, build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_IDS = N_SPECIAL + 40
N_CATALOGUE = N_IDS + 12  # twelve articles without an id embedding
MAX_HISTORY = 6
CONTEXT = ContextSpec((FeatureSpec("gender", "categorical", "customer", N_SPECIAL + 2, 4),
                       FeatureSpec("occasion", "categorical", "outfit", N_SPECIAL + 4, 4)))  # fmt: skip
HISTORY = ContextSpec(CONTEXT.features + (FeatureSpec(HISTORY_FEATURE, "history", "history", N_IDS, 8,
                                                      max_values=MAX_HISTORY),))  # fmt: skip
SINGLE = ContextSpec((FeatureSpec("product_type", "categorical", "article", N_SPECIAL + 5, 4),
                      FeatureSpec("colour", "categorical", "article", N_SPECIAL + 4, 4),
                      FeatureSpec("price", "numeric", "article", N_SPECIAL + 6, 4)))  # fmt: skip
MULTI = ContextSpec(SINGLE.features[:1] + (FeatureSpec("colours", "multi_categorical", "article", N_SPECIAL + 4, 4,
                                                       max_values=3),) + SINGLE.features[2:])  # fmt: skip
SMALL = ModelConfig(d_model=16, n_blocks=2, n_heads=4, d_ff=32, dropout=0.1, max_set_size=8, attribute_overlap=True)


def catalogue(spec: ContextSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values per article (some missing: PAD), multi-valued rows of 0-3 values; specials hold none."""
    g = torch.Generator().manual_seed(seed)
    tables = {}
    for f in spec.features:
        if f.is_list:
            values = torch.randint(N_SPECIAL, f.cardinality, (N_CATALOGUE, f.max_values), generator=g)
            n_values = torch.randint(0, f.max_values + 1, (N_CATALOGUE, 1), generator=g)
            tables[f.name] = values.masked_fill(torch.arange(f.max_values) >= n_values, PAD_INDEX)
        else:
            values = torch.randint(N_SPECIAL, f.cardinality, (N_CATALOGUE,), generator=g)
            tables[f.name] = values.masked_fill(torch.rand(N_CATALOGUE, generator=g) < 0.1, PAD_INDEX)
        tables[f.name][:N_SPECIAL] = PAD_INDEX
    return tables


def attribute_model(
    model_name: str, attributes: ContextSpec, history: bool = False, seed: int = 0, combine: str = "sum"
):
    """A small "_attrs" model with the overlap on, its offsets (and the history repeat's weights, the state's reads
    and updates between blocks) nonzero."""
    torch.manual_seed(seed)
    model = build_model(SMALL, model_name + "_attrs", N_IDS, HISTORY if history else CONTEXT, attributes, combine)
    model.set_catalogue(catalogue(attributes, seed))
    wake_between_blocks(model)
    with torch.no_grad():
        for offset in model.reader(AttributeOverlap).offsets:
            offset.normal_(std=0.1)
        if history:
            model.reader(HistoryRepeat).weight.copy_(torch.tensor([0.05, 0.02]))
    return model.eval()


def outfits(n: int, history: bool = False, seed: int = 0) -> EncodedOutfits:
    """n outfits of 2-6 distinct catalogue articles (some without an id, a few [UNK]), with contexts."""
    g = torch.Generator().manual_seed(seed)
    items = torch.full((n, 8), PAD_INDEX)
    for row, length in enumerate(torch.randint(2, 7, (n,), generator=g).tolist()):
        items[row, :length] = torch.randperm(N_CATALOGUE - N_SPECIAL, generator=g)[:length] + N_SPECIAL
    items[torch.rand(items.shape, generator=g) < 0.03] = UNKNOWN_INDEX
    items[:, 0] = torch.where(items[:, 0] == UNKNOWN_INDEX, N_SPECIAL, items[:, 0])
    context = {"gender": torch.randint(N_SPECIAL, N_SPECIAL + 2, (n,), generator=g),
               "occasion": torch.randint(N_SPECIAL, N_SPECIAL + 4, (n,), generator=g)}  # fmt: skip
    if history:
        held = torch.stack([torch.randperm(N_IDS - N_SPECIAL, generator=g)[:MAX_HISTORY] + N_SPECIAL for _ in range(n)])
        context[HISTORY_FEATURE] = held.masked_fill(
            torch.arange(MAX_HISTORY) >= torch.randint(0, MAX_HISTORY + 1, (n, 1), generator=g), PAD_INDEX
        )
    return EncodedOutfits(items, context)


# --- the plain computation, as before ---------------------------------------------------------------------


def plain_logits(model, items, context):
    """masked_logits as every batch computed them before: the output layer built for the call and the overlap
    offsets by `offsets_for` (the computation with gradient, which training keeps)."""
    with torch.enable_grad():
        return model.masked_logits(items, context).detach()


def plain_offsets(model, items):
    with torch.enable_grad():
        offsets = model.outfit_offsets(items, items == MASK_INDEX)
    return None if offsets is None else offsets.detach()


def plain_case_ranks(model, data: EncodedOutfits, batch_size: int, dependence: bool) -> dict:
    """case_ranks as it was (one batch of cases at a time, the shuffled pass with the donor's offsets added by
    masked_logits and taken out again), on the plain computation."""
    items, context = data.items, data.context
    outfit, position = (items != PAD_INDEX).nonzero(as_tuple=True)
    target = items[outfit, position]
    known = target != UNKNOWN_INDEX
    outfit, position, target = outfit[known], position[known], target[known]
    lengths = (items != PAD_INDEX).sum(dim=1)
    by_length = torch.sort(lengths[outfit], stable=True).indices
    donor = donor_outfits(items)
    article_index = torch.arange(model.n_items)
    log_probs, shuffled, ranks = [], [], []
    for start in range(0, len(target), batch_size):
        rows = by_length[start : start + batch_size]
        o, p, t = outfit[rows], position[rows], target[rows, None]
        masked = items[o, : int(lengths[o].max())].clone()
        masked[torch.arange(len(o)), p] = MASK_INDEX
        case_context = {name: values[o] for name, values in context.items()}
        logits = plain_logits(model, masked, case_context).float()
        logits[:, :N_SPECIAL] = float("-inf")
        target_logit = logits.gather(1, t)
        log_probs.append(target_logit - torch.logsumexp(logits[:, N_SPECIAL:], dim=1, keepdim=True))
        if dependence:
            donor_masked = items[donor[o], : masked.shape[1]].clone()
            donor_masked[torch.arange(len(o)), p] = MASK_INDEX
            other = plain_logits(model, donor_masked, case_context).float()
            real = plain_offsets(model, masked)  # without the context: the overlap's only
            if real is not None:
                other = other - plain_offsets(model, donor_masked) + real
            other = other[:, N_SPECIAL:]
            shuffled.append(other.gather(1, t - N_SPECIAL) - torch.logsumexp(other, dim=1, keepdim=True))
        scores = logits.scatter(1, masked, float("-inf"))
        ahead = (scores > target_logit) | ((scores == target_logit) & (article_index < t))
        ranks.append(1 + ahead.sum(dim=1))

    def in_outfit_order(chunks):
        values = torch.cat(chunks).reshape(-1)
        restored = torch.empty_like(values)
        restored[by_length] = values
        return restored.double().numpy() if values.is_floating_point() else restored.numpy()

    out = {"log_prob": in_outfit_order(log_probs), "rank": in_outfit_order(ranks)}
    if dependence:
        out["log_prob_shuffled"] = in_outfit_order(shuffled)
    return out


# --- the tests ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attributes", [SINGLE, MULTI], ids=["single-valued", "multi-valued"])
@pytest.mark.parametrize("history", [False, True], ids=["", "history"])
def test_the_catalogue_offsets_are_the_plain_ones(attributes, history):
    model = attribute_model("global_state", attributes, history)
    data = outfits(30, history)
    masked = data.items.clone()
    masked[torch.arange(30), torch.randint(0, 2, (30,))] = MASK_INDEX
    select = masked == MASK_INDEX
    with torch.no_grad():
        fast = model.outfit_offsets(masked, select, context=data.context)
    with torch.enable_grad():
        plain = model.outfit_offsets(masked, select, context=data.context).detach()
    assert fast.shape == plain.shape == (30, N_CATALOGUE) and plain.abs().sum() > 0
    assert fast.stride(0) == 1  # article-major: added to the logits block by block
    if attributes is SINGLE:
        assert torch.equal(fast, plain)
    else:
        assert not torch.equal(fast, plain)  # the mean over 2-3 values: the same up to a rounding
        torch.testing.assert_close(fast, plain, rtol=0, atol=1e-6)


@pytest.mark.parametrize("attributes", [SINGLE, MULTI], ids=["single-valued", "multi-valued"])
@pytest.mark.parametrize(
    "model_name,history,combine",
    [
        ("global_state", False, "sum"),
        ("global_state", True, "sum"),
        ("global_state", True, "concat"),
        ("global_state_two_way", True, "sum"),
        ("adaptive_norm", True, "sum"),
        ("bag_of_items_context", True, "sum"),
    ],
)
def test_validation_ranks_and_dependence_are_the_plain_computation(attributes, model_name, history, combine):
    """(The history models read the held output layer's vectors for their outfit and history articles too,
    where it holds them: ContextualBert with the attributes summed.)"""
    model = attribute_model(model_name, attributes, history, combine=combine)
    data = outfits(60, history)
    before = plain_case_ranks(model, data, batch_size=16, dependence=True)
    validation = case_ranks(model, data, 16, "cpu", with_ranks=False)
    cases = case_ranks(model, data, 16, "cpu", dependence=True)
    stuck = case_ranks(model, data, 16, "cpu", with_ranks=False, dependence=True)  # training's stuck check
    for key in ("log_prob", "log_prob_shuffled"):  # its log-probabilities a block of articles at a time
        np.testing.assert_allclose(stuck[key], before[key], rtol=0, atol=1e-6)
    assert outfit_dependence(stuck["log_prob"], stuck["log_prob_shuffled"]) == pytest.approx(
        outfit_dependence(before["log_prob"], before["log_prob_shuffled"]), abs=1e-6
    )
    assert np.array_equal(validation["log_prob"], cases["log_prob"])
    assert np.array_equal(cases["rank"], before["rank"])
    if attributes is SINGLE:  # the arithmetic of the real pass is unchanged: bit for bit
        assert np.array_equal(cases["log_prob"], before["log_prob"])
    np.testing.assert_allclose(cases["log_prob"], before["log_prob"], rtol=0, atol=1e-6)
    # the shuffled pass: the real outfit's offsets, no longer added after the donor's were taken out
    np.testing.assert_allclose(cases["log_prob_shuffled"], before["log_prob_shuffled"], rtol=0, atol=1e-6)
    dependence = outfit_dependence(cases["log_prob"], cases["log_prob_shuffled"])
    assert dependence == pytest.approx(outfit_dependence(before["log_prob"], before["log_prob_shuffled"]), abs=1e-6)
    assert cases["log_prob"].mean() == pytest.approx(before["log_prob"].mean(), abs=1e-6)


@pytest.mark.parametrize("history", [False, True], ids=["", "history"])
def test_target_log_probs_in_blocks_are_the_log_softmax_of_the_whole_logits(history):
    model = attribute_model("global_state", MULTI, history)
    data = outfits(40, history)
    items = data.items.clone()
    position = torch.randint(0, 2, (40,))
    targets = items[torch.arange(40), position][:, None]
    items[torch.arange(40), position] = MASK_INDEX
    with torch.no_grad(), model.catalogue_pass():
        logits = model.masked_logits(items, data.context)[:, N_SPECIAL:]
        expected = logits.gather(1, targets - N_SPECIAL) - torch.logsumexp(logits, dim=1, keepdim=True)
        offsets = model.outfit_offsets(items, items == MASK_INDEX, context=data.context, blocks=True)
        for block in (7, 2048):  # blocks of 7 articles: the sum over many blocks, the target in one of them
            got = model.target_log_probs(items, data.context, targets, offsets, block=block)
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
        dense = model.outfit_offsets(items, items == MASK_INDEX, context=data.context)
        torch.testing.assert_close(
            model.target_log_probs(items, data.context, targets, dense, block=7), expected, rtol=0, atol=1e-6
        )


def test_a_model_of_ids_keeps_the_bits_of_its_dependence():
    """The models of ids (Table 1's rows) rank as before: the real and the shuffled pass bit for bit."""
    torch.manual_seed(0)
    model = build_model(SMALL, "global_state", N_IDS, HISTORY).eval()
    with torch.no_grad():
        model.reader(HistoryRepeat).weight.copy_(torch.tensor([0.05, 0.02]))
    data = outfits(60, history=True)
    data.items[data.items >= N_IDS] = UNKNOWN_INDEX  # ids only
    before = plain_case_ranks(model, data, batch_size=16, dependence=True)
    cases = case_ranks(model, data, 16, "cpu", dependence=True)
    for key in ("log_prob", "log_prob_shuffled", "rank"):
        assert np.array_equal(cases[key], before[key]), key


@pytest.mark.parametrize("attributes", [SINGLE, MULTI], ids=["single-valued", "multi-valued"])
def test_fitb_answers_are_the_plain_computations(attributes):
    model = attribute_model("global_state", attributes)
    data = outfits(50)
    questions = make_questions(
        data.items.numpy(),
        N_CATALOGUE,
        FitbConfig(hard_attributes=["product_type"]),
        {k: v.numpy() for k, v in model.attributes.catalogue().items()},
    )
    fast = answer(model, data, questions, 16, "cpu")
    masked = data.items[questions.outfit].clone()
    masked[torch.arange(len(masked)), torch.as_tensor(questions.position)] = MASK_INDEX
    logits = plain_logits(model, masked, {k: v[questions.outfit] for k, v in data.context.items()})
    for protocol in PROTOCOLS:
        asked = questions.asked[protocol]
        scores = logits.gather(1, torch.as_tensor(questions.candidates[protocol]))
        top = scores == scores.max(dim=1, keepdim=True).values
        slot = torch.as_tensor(questions.answer[protocol])[:, None]
        expected = (top.gather(1, slot).squeeze(1).double() / top.sum(dim=1).double()).numpy()
        assert asked.any() and np.array_equal(fast[protocol][asked], expected[asked])


def test_a_pass_builds_the_output_layer_once_and_training_mode_builds_it_every_time(monkeypatch):
    model = attribute_model("global_state", SINGLE)
    built = []
    layer = model.output.layer
    monkeypatch.setattr(model.output, "layer", lambda *a: built.append(a) or layer(*a))
    data = outfits(60)
    case_ranks(model, data, 16, "cpu", dependence=True)  # 16 batches, twice the encoder each
    assert built == [()] and model.output.held is None  # once, and let go after the pass
    with model.catalogue_pass():
        with model.catalogue_pass():  # nested: the enclosing pass's
            case_ranks(model, data, 16, "cpu", with_ranks=False)
        assert model.output.held is not None
    assert len(built) == 2 and model.output.held is None
    model.train()
    assert not model.hold_catalogue()  # training mode: the id dropout draws anew every step
    model.set_id_dropout(0.5)
    items = outfits(4).items.clone()
    items[:, 0] = MASK_INDEX
    with torch.no_grad():
        first, second = model.masked_logits(items, outfits(4).context), model.masked_logits(items, outfits(4).context)
    assert len(built) == 4 and not torch.equal(first, second)


def test_a_new_catalogue_releases_the_held_output_layer_and_the_overlap_reads_it():
    model = attribute_model("none", SINGLE)
    data = outfits(10)
    items = data.items.clone()
    items[:, 0] = MASK_INDEX
    with torch.no_grad():
        model.hold_catalogue()
        before = model.masked_logits(items, data.context)
        changed = catalogue(SINGLE, seed=1)
        model.set_catalogue(changed)
        assert model.output.held is None
        after = model.masked_logits(items, data.context)
        assert torch.equal(after, plain_logits(model, items, data.context))
        changed["colour"][N_SPECIAL:] = N_SPECIAL  # changed in place: the overlap's value table follows
        assert torch.equal(model.masked_logits(items, data.context), plain_logits(model, items, data.context))
    assert not torch.equal(before, after)


def test_a_long_pass_shows_a_progress_bar(monkeypatch, capsys):
    model = attribute_model("global_state", SINGLE)
    case_ranks(model, outfits(20), 16, "cpu", with_ranks=False)
    assert "ranking" not in capsys.readouterr().err  # a tiny pass: no bar
    monkeypatch.setattr(ranking, "PROGRESS_MIN_CASES", 1)
    case_ranks(model, outfits(20), 16, "cpu", with_ranks=False, dependence=True)
    assert "global_state_attrs dependence" in capsys.readouterr().err


# --- the count models: ranks from their closed form -------------------------------------------------------


def count_cases(n_articles: int, n_outfits: int, seed: int) -> tuple[np.ndarray, np.ndarray, EncodedOutfits]:
    """Counts with many ties (most articles seen 1-3 times; an article with an id is seen), one attribute of 1-9
    values, and outfits of 1-7 distinct articles (a few [UNK]) with histories of 0-12 articles (some in the
    outfit, some held twice)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 4, (n_articles,), generator=g)
    counts[torch.randint(N_SPECIAL, n_articles, (5,), generator=g)] = 50
    counts[:N_SPECIAL] = 0
    n_values = int(torch.randint(1, 10, (1,), generator=g))
    values = torch.randint(1, n_values + 1, (n_articles,), generator=g)
    values[:N_SPECIAL] = 0
    items = torch.full((n_outfits, 8), PAD_INDEX)
    for row, length in enumerate(torch.randint(1, 8, (n_outfits,), generator=g).tolist()):
        items[row, :length] = torch.randperm(n_articles - N_SPECIAL, generator=g)[:length] + N_SPECIAL
    items[(torch.rand(items.shape, generator=g) < 0.03) & (items != PAD_INDEX)] = UNKNOWN_INDEX
    history = torch.randint(N_SPECIAL, n_articles, (n_outfits, 12), generator=g)
    history[:, :2] = items[:, 1:3]  # some of the outfit's own articles (or padding)
    history[:, 5] = history[:, 4]  # an article worn twice: it holds two slots
    history = history.masked_fill(torch.arange(12) >= torch.randint(0, 13, (n_outfits, 1), generator=g), PAD_INDEX)
    return counts.numpy(), values.numpy(), EncodedOutfits(items, {HISTORY_FEATURE: history})


def count_models(counts: np.ndarray, values: np.ndarray):
    n_ids = len(counts) - 7  # the last seven articles without an id
    yield "popularity", PopularityModel(counts)
    yield "attributes", AttributePopularityModel(values, counts, n_ids, in_outfit_share=0.2)
    yield "no type twice", AttributePopularityModel(values, counts, n_ids, in_outfit_share=0.0)
    for weight in (0.0, 0.3):
        yield f"history {weight}", HistoryPopularityModel(counts, weight)


@pytest.mark.parametrize("n_articles, cells", [(40, None), (3_000, None), (3_000, 100)])
def test_the_count_models_closed_form_ranks_are_the_scored_catalogues(n_articles, cells, monkeypatch):
    if cells is not None:  # the attribute popularity's cases a few at a time, as with an attribute of many values
        monkeypatch.setattr("contextual_bert.evaluation.counts.CLOSED_FORM_CELLS", cells)
    counts, values, data = count_cases(n_articles, 300, seed=n_articles)
    for name, model in count_models(counts, values):
        closed = case_ranks(model, data, batch_size=64, device="cpu")
        plain = plain_case_ranks(model, data, batch_size=64, dependence=False)
        np.testing.assert_array_equal(closed["rank"], plain["rank"], err_msg=name)
        np.testing.assert_allclose(closed["log_prob"], plain["log_prob"], atol=1e-6, rtol=0, err_msg=name)
        without = case_ranks(model, data, batch_size=64, device="cpu", with_ranks=False)
        assert "rank" not in without and np.array_equal(without["log_prob"], closed["log_prob"])


@pytest.mark.parametrize("n_articles", [40, 3_000])
def test_the_attribute_history_counts_log_probs_of_every_weight_are_its_ranking_passes(n_articles):
    """attribute_history_log_probs (the weight's one pass) gives what a ranking pass of the model gives at each
    weight, some histories holding articles without an id."""
    from contextual_bert.evaluation.counts import (
        HISTORY_WEIGHTS,
        AttributeHistoryPopularityModel,
        attribute_history_log_probs,
    )

    counts, values, data = count_cases(n_articles, 300, seed=n_articles)
    n_ids = len(counts) - 7
    attribute = AttributePopularityModel(values, counts, n_ids, in_outfit_share=0.2)
    together = attribute_history_log_probs(attribute, counts[:n_ids], data, HISTORY_WEIGHTS, batch_size=64)
    for i, weight in enumerate(HISTORY_WEIGHTS):
        model = AttributeHistoryPopularityModel(attribute, counts[:n_ids], weight)
        passed = case_ranks(model, data, batch_size=64, device="cpu", with_ranks=False)["log_prob"]
        np.testing.assert_allclose(together[:, i], passed, atol=2e-5, rtol=0, err_msg=str(weight))


def test_a_tie_that_rounding_makes_is_ranked_from_the_scores(monkeypatch):
    """Two articles of one value whose log P(a | v) differ by a float32 step can score the same once log P(v | O)
    is added: their order is then by index, not by log P(a | v) (the closed form's fallback)."""
    counts, values, data = count_cases(200, 200, seed=1)
    model = AttributePopularityModel(values, counts, len(counts), in_outfit_share=0.2)
    first_value = torch.from_numpy(values) == int(values[N_SPECIAL])
    group = first_value.nonzero()[:, 0]
    model.log_within[group] = -3.0 + torch.arange(len(group)).float() % 3 * 2.4e-7  # a float32 step apart
    unsure = []
    found = model._ahead_by_value
    monkeypatch.setattr(model, "_ahead_by_value", lambda *args: unsure.append(found(*args)[1]) or found(*args))
    closed = case_ranks(model, data, batch_size=64, device="cpu")
    assert torch.cat(unsure).any()  # the fallback ran
    plain = plain_case_ranks(model, data, batch_size=64, dependence=False)
    np.testing.assert_array_equal(closed["rank"], plain["rank"])
