import itertools
import json
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import PLAIN_TRAIN

import contextual_bert.training as training
from contextual_bert.config import ModelConfig, TrainConfig
from contextual_bert.data.feature_spec import (
    MASK_INDEX,
    N_SPECIAL,
    PAD_INDEX,
    UNKNOWN_INDEX,
    ContextSpec,
    EncodedOutfits,
    FeatureSpec,
)
from contextual_bert.evaluation.counts import PopularityModel
from contextual_bert.evaluation.evaluate import metrics_from_ranks
from contextual_bert.evaluation.ranking import case_ranks
from contextual_bert.model import AttributeOverlap, ContextualBert, load_checkpoint
from contextual_bert.training import LinearCrossEntropy, fit, length_batches, mask_items

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: a second thread only adds synchronisation

# Planted data: an outfit is 3 of 6 "shared" articles (uninformative about the customer) and one "style"
# article, drawn from the 4 articles of the customer's style (8 styles). Only the context tells which style.
N_STYLES, PER_STYLE, N_SHARED = 8, 4, 6
N_ITEMS = N_SPECIAL + N_STYLES * PER_STYLE + N_SHARED
SPEC = ContextSpec(
    (
        FeatureSpec("style", "categorical", "customer", N_SPECIAL + N_STYLES, 8),
        FeatureSpec("brands", "multi_categorical", "customer", N_SPECIAL + 6, 4, max_values=3),  # noise
        FeatureSpec("age", "numeric", "customer", N_SPECIAL + 5, 4),  # noise
    )
)
TINY = ModelConfig(d_model=32, n_blocks=2, n_heads=4, d_ff=64, dropout=0.0, max_set_size=6)


def planted(n: int, seed: int) -> EncodedOutfits:
    g = torch.Generator().manual_seed(seed)
    style = torch.randint(0, N_STYLES, (n,), generator=g)
    style_item = N_SPECIAL + style * PER_STYLE + torch.randint(0, PER_STYLE, (n,), generator=g)
    shared = N_SPECIAL + N_STYLES * PER_STYLE + torch.rand(n, N_SHARED, generator=g).argsort(dim=1)[:, :3]
    items = torch.zeros(n, TINY.max_set_size, dtype=torch.long)
    items[:, :4] = torch.cat([shared, style_item[:, None]], dim=1)[:, torch.randperm(4, generator=g)]
    brands = torch.randint(N_SPECIAL, N_SPECIAL + 6, (n, 3), generator=g)
    brands[torch.rand(n, 3, generator=g) < 0.3] = PAD_INDEX
    context = {
        "style": style + N_SPECIAL,
        "brands": brands,
        "age": torch.randint(N_SPECIAL, N_SPECIAL + 5, (n,), generator=g),
    }
    return EncodedOutfits(items, context)


def new_model(variant: str, seed: int = 0, cfg: ModelConfig = TINY) -> ContextualBert:
    torch.manual_seed(seed)
    return ContextualBert(cfg, variant, N_ITEMS, SPEC)


# --- masking and the loss -------------------------------------------------------------------------------


def test_mask_items_masks_at_least_one_real_item_per_outfit_bert_style():
    g = torch.Generator().manual_seed(0)
    items = torch.randint(N_SPECIAL, 1000, (20_000, 8))
    items[:, 6:] = PAD_INDEX
    items[::2, 4:] = PAD_INDEX  # outfits of 4 and 6 items
    items[::7, 1] = UNKNOWN_INDEX
    cfg = TrainConfig(mask_prob=0.15, mask_token_prob=0.8, random_token_prob=0.1)
    inputs, predict = mask_items(items, 1000, cfg, g)

    assert (predict.sum(dim=1) >= 1).all()
    assert not predict[(items == PAD_INDEX) | (items == UNKNOWN_INDEX)].any()
    assert torch.equal(inputs[~predict], items[~predict])
    # Each real item with 0.15, plus one forced where none was drawn: 0.15 n + 0.85^n expected per outfit.
    n = ((items != PAD_INDEX) & (items != UNKNOWN_INDEX)).sum(dim=1).double()
    assert predict.sum().item() / (0.15 * n + 0.85**n).sum().item() == pytest.approx(1.0, abs=0.02)
    # The forced choice is not biased to a position: in outfits of 4, each position is chosen as often.
    rows = torch.arange(len(items))
    per_position = predict[(rows % 2 == 0) & (rows % 7 != 0), :4].double().mean(dim=0)
    torch.testing.assert_close(per_position, torch.full((4,), (0.15 * 4 + 0.85**4) / 4, dtype=torch.double),
                               atol=0.02, rtol=0)  # fmt: skip
    chosen_inputs = inputs[predict]
    assert (chosen_inputs == MASK_INDEX).float().mean().item() == pytest.approx(0.8, abs=0.01)
    replaced = (chosen_inputs != MASK_INDEX) & (chosen_inputs != items[predict])
    assert replaced.float().mean().item() == pytest.approx(0.1, abs=0.01)
    assert (chosen_inputs[chosen_inputs != MASK_INDEX] >= N_SPECIAL).all()
    again_inputs, again_predict = mask_items(items, 1000, cfg, torch.Generator().manual_seed(0))
    assert torch.equal(again_inputs, inputs) and torch.equal(again_predict, predict)


def test_fused_cross_entropy_equals_the_plain_one_with_gradients():
    torch.manual_seed(0)
    table = torch.randn(N_SPECIAL + 300, 16, requires_grad=True)  # tied: the output layer is rows 3..
    bias = torch.randn(N_SPECIAL + 300, requires_grad=True)
    h = torch.randn(70, 16, requires_grad=True)
    targets = torch.randint(0, 300, (70,))

    def grads(loss):
        loss.backward()
        out = [t.grad.clone() for t in (h, table, bias)]
        for t in (h, table, bias):
            t.grad = None
        return loss.detach(), out

    for grad_loss in (1.0, 2.5):
        fused, fused_grads = grads(
            grad_loss * LinearCrossEntropy.apply(h, table, bias, targets + N_SPECIAL, N_SPECIAL, 16)
        )
        plain, plain_grads = grads(
            grad_loss * F.cross_entropy(F.linear(h, table[N_SPECIAL:], bias[N_SPECIAL:]), targets)
        )
        torch.testing.assert_close(fused, plain)
        for a, b in zip(fused_grads, plain_grads):
            torch.testing.assert_close(a, b)
        assert fused_grads[1][:N_SPECIAL].abs().sum() == 0  # the special rows are never an output


@pytest.mark.parametrize("overlap", [False, True])
def test_the_cpu_loss_of_an_attribute_model_equals_the_plain_one_with_gradients(overlap):
    """The output layer of a "_attrs" model is computed from its attribute embeddings, and with the outfit
    offsets (AttributeOverlap) its logits get an offset per row: the fused CPU loss must pass its gradient
    back through both exactly as autograd does."""
    from contextual_bert.model import build_model

    attributes = ContextSpec((FeatureSpec("product_type", "categorical", "article", N_SPECIAL + 5, 8),))
    torch.manual_seed(0)
    model = build_model(TINY.model_copy(update={"attribute_overlap": overlap}), "none_attrs", N_ITEMS, SPEC, attributes)
    n = N_ITEMS + 6  # six articles without an id: targets too
    model.set_catalogue(
        {
            "product_type": torch.cat(
                [torch.zeros(N_SPECIAL, dtype=torch.long), torch.randint(1, N_SPECIAL + 5, (n - N_SPECIAL,))]
            )
        }
    )
    if overlap:
        with torch.no_grad():  # offsets away from their zero start, so that they count
            for offset in model.reader(AttributeOverlap).offsets:
                offset.normal_(0, 0.5)
    data = planted(32, 0)
    data.items[:4, 4] = N_ITEMS + torch.arange(4)
    inputs, predict = mask_items(
        data.items, model.n_items, TrainConfig(mask_prob=0.5), torch.Generator().manual_seed(0)
    )
    losses, grads = [], []
    for fused in (True, False):
        model.zero_grad()
        with torch.set_grad_enabled(True):
            if fused:
                loss = training.masked_item_loss(model, inputs, data.context, predict, data.items)
            else:
                head = model.head(model(inputs, data.context, select=predict))
                offsets = model.outfit_offsets(inputs, predict, context=data.context)
                loss = F.cross_entropy(model.article_logits(head, offsets), data.items[predict] - N_SPECIAL)
        loss.backward()
        losses.append(loss.detach())
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(losses[0], losses[1])
    assert grads[0].keys() == grads[1].keys() and any("attributes" in k for k in grads[0])
    assert overlap == any("logit_offsets" in k for k in grads[0])
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], rtol=1e-4, atol=1e-6)


# --- the loop -------------------------------------------------------------------------------------------

PLANTED_TRAIN = TrainConfig(batch_size=64, max_epochs=8, learning_rate=3e-3, lr_warmup_steps=20, patience=8,
                            device="cpu", **PLAIN_TRAIN)  # fmt: skip


def test_training_on_a_planted_context_signal_learns_it(tmp_path):
    train, val, test = planted(2000, 0), planted(300, 1), planted(400, 2)
    counts = torch.bincount(train.items.flatten(), minlength=N_ITEMS).numpy()
    popularity = case_ranks(PopularityModel(counts), test, 512, "cpu")
    results = {"popularity": metrics_from_ranks(popularity["rank"], popularity["log_prob"])}
    for variant in ("none", "global_state_update"):
        model = new_model(variant)
        untrained = case_ranks(model, test, 512, "cpu")
        fit(model, train, val, PLANTED_TRAIN, tmp_path / variant, seed=0)
        history = json.loads((tmp_path / variant / "curve.json").read_text())
        assert history[-1]["train_loss"] < history[0]["train_loss"] - 0.3
        best, _ = load_checkpoint(tmp_path / variant / "checkpoint.pt")
        cases = case_ranks(best, test, 512, "cpu")
        results[variant] = metrics_from_ranks(cases["rank"], cases["log_prob"])
        assert results[variant]["cross_entropy"] < -untrained["log_prob"].mean() - 0.5

    # The optimum is ln 4 + (ln 32 - ln 4) / 4 ~ 1.91 nats without the context and ln 4 ~ 1.39 with it.
    assert results["none"]["cross_entropy"] < results["popularity"]["cross_entropy"] - 0.3
    assert results["global_state_update"]["cross_entropy"] < results["none"]["cross_entropy"] - 0.15
    assert results["global_state_update"]["recall@5"] > results["none"]["recall@5"] + 0.1
    assert results["global_state_update"]["recall@5"] > results["popularity"]["recall@5"] + 0.1


@pytest.mark.slow
@pytest.mark.parametrize("variant, epochs", [("concat", 8), ("global_state", 8), ("new_position", 16)])
def test_every_context_variant_learns_what_no_context_free_model_can(tmp_path, variant, epochs):
    train, val, test = planted(2000, 0), planted(300, 1), planted(400, 2)
    fit(new_model(variant), train, val, PLANTED_TRAIN.model_copy(update={"max_epochs": epochs}), tmp_path, seed=0)
    best, _ = load_checkpoint(tmp_path / "checkpoint.pt")
    cases = case_ranks(best, test, 512, "cpu")
    metrics = metrics_from_ranks(cases["rank"], cases["log_prob"])
    assert metrics["cross_entropy"] < 1.8  # without the context at best ~1.91 nats
    assert metrics["recall@5"] > 0.95  # without it ~0.79: 3/4 + 1/4 * 5/32, the style item ranks uniformly among 32


SHORT = TrainConfig(
    batch_size=32, max_epochs=3, learning_rate=3e-3, lr_warmup_steps=5, patience=5, device="cpu", **PLAIN_TRAIN
)
DROPOUT = TINY.model_copy(update={"dropout": 0.2})  # dropout draws from the global generator: resume restores it


@pytest.mark.parametrize("variant", ["global_state_update", "global_state_two_way", "adaptive_norm"])
def test_a_resumed_run_ends_where_an_uninterrupted_run_ends(tmp_path, variant):
    train, val = planted(300, 0), planted(60, 1)
    cfg = SHORT.model_copy(update={"bag_warmup_epochs": 2, "probe_outfits": 20})  # killed inside the bag warm-up
    whole = new_model(variant, cfg=DROPOUT)
    whole_metrics = fit(whole, train, val, cfg, tmp_path / "whole", seed=7)

    # Killed after epoch 1; the resumed process starts from a differently initialised model.
    def kill(epoch, row):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(new_model(variant, cfg=DROPOUT), train, val, cfg, tmp_path / "resumed", seed=7,
            on_epoch_end=kill)  # fmt: skip
    logged = []
    resumed = new_model(variant, seed=2, cfg=DROPOUT)
    resumed_metrics = fit(resumed, train, val, cfg, tmp_path / "resumed", seed=7,
                          on_epoch_end=lambda epoch, row: logged.append(epoch))  # fmt: skip

    assert logged == [2, 3]
    for name, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    history = [json.loads((tmp_path / run / "curve.json").read_text()) for run in ("whole", "resumed")]
    for key in ("epoch", "train_loss", "train_cross_entropy", "val_cross_entropy", "learning_rate"):
        assert [row[key] for row in history[0]] == [row[key] for row in history[1]], key
    for key in ("best_epoch", "best_val_cross_entropy", "epochs", "parameters"):
        assert whole_metrics[key] == resumed_metrics[key]


def test_killed_inside_the_epoch_hook_resumes_exactly(tmp_path):
    train, val = planted(200, 0), planted(40, 1)
    whole = new_model("concat", cfg=DROPOUT)
    fit(whole, train, val, SHORT, tmp_path / "whole", seed=3)

    def kill(epoch, row):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(new_model("concat", cfg=DROPOUT), train, val, SHORT, tmp_path / "killed", seed=3, on_epoch_end=kill)
    resumed = new_model("concat", seed=5, cfg=DROPOUT)
    fit(resumed, train, val, SHORT, tmp_path / "killed", seed=3)
    for name, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name


def test_more_patience_resumes_a_run_that_stopped_early(tmp_path, monkeypatch):
    """Patience only decides when a run stops: a run stopped by a smaller patience goes on under a larger one
    and ends exactly where a run with the larger patience from the start ends."""
    calls = itertools.count()
    always_worse = lambda *a, **k: float(next(calls))
    monkeypatch.setattr(training.trainer, "validation_cross_entropy", always_worse)
    train, val = planted(120, 0), planted(30, 1)
    cfg = SHORT.model_copy(update={"max_epochs": 4})
    stopped = fit(new_model("none"), train, val, cfg.model_copy(update={"patience": 1}), tmp_path / "run", seed=0)
    assert stopped["stopped_early"] and stopped["epochs"] == 2
    logged = []
    resumed = new_model("none", seed=3)
    metrics = fit(resumed, train, val, cfg, tmp_path / "run", seed=0, on_epoch_end=lambda e, r: logged.append(e))
    assert logged == [3, 4] and metrics["epochs"] == 4 and not metrics["stopped_early"]
    whole = new_model("none")
    fit(whole, train, val, cfg, tmp_path / "whole", seed=0)
    for name, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name


def test_a_finished_run_is_not_retrained_and_a_changed_one_restarts(tmp_path):
    train, val = planted(200, 0), planted(40, 1)
    first = fit(new_model("new_position"), train, val, SHORT, tmp_path, seed=0)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"checkpoint.pt", "last.pt", "curve.json", "metrics.json"} <= files
    row = json.loads((tmp_path / "curve.json").read_text())[0]
    assert set(row) == {"epoch", "train_loss", "val_cross_entropy", "learning_rate", "samples_per_s", "seconds"}
    assert json.loads((tmp_path / "metrics.json").read_text()) == first

    calls = []
    again = fit(new_model("new_position"), train, val, SHORT, tmp_path, seed=0,
                on_epoch_end=lambda e, r: calls.append(e))  # fmt: skip
    assert calls == [] and again == first

    changed = SHORT.model_copy(update={"learning_rate": 1e-3})
    fit(new_model("new_position"), train, val, changed, tmp_path, seed=0, on_epoch_end=lambda e, r: calls.append(e))
    assert calls == [1, 2, 3]
    assert json.loads((tmp_path / "curve.json").read_text())[0]["train_loss"] != row["train_loss"]


def test_a_finished_run_of_other_code_is_trained_again(tmp_path, monkeypatch):
    """DVC re-runs a training when code it runs changed: last.pt of the old code must not pass for it."""
    train, val = planted(200, 0), planted(40, 1)
    fit(new_model("new_position"), train, val, SHORT, tmp_path, seed=0)
    monkeypatch.setattr(training.resume, "code_digest", lambda: "other code")
    calls = []
    fit(new_model("new_position"), train, val, SHORT, tmp_path, seed=0, on_epoch_end=lambda e, r: calls.append(e))
    assert calls == [1, 2, 3]


def test_id_dropout_is_read_by_attribute_models_only(tmp_path):
    """train.id_dropout changes how an "_attrs" model trains; a model without attributes trains bit-identically
    with any value, and its run key (what a finished run is recognised by) does not hold it."""
    from contextual_bert.model import build_model

    train, val = planted(200, 0), planted(40, 1)
    cfg = SHORT.model_copy(update={"max_epochs": 1})
    dropped = cfg.model_copy(update={"id_dropout": 0.5})
    trained = {}
    for name, train_cfg in (("off", cfg), ("on", dropped)):
        model = new_model("global_state")
        fit(model, train, val, train_cfg, tmp_path / f"plain-{name}", seed=0)
        trained[name] = model.state_dict()
    for key, value in trained["off"].items():
        assert torch.equal(value, trained["on"][key]), key
    plain = new_model("global_state")
    assert training.run_key(plain, cfg, 0, train, val, "cpu") == training.run_key(plain, dropped, 0, train, val, "cpu")
    assert "id_dropout" not in training.run_key(plain, dropped, 0, train, val, "cpu")["train"]

    attributes = ContextSpec((FeatureSpec("product_type", "categorical", "article", N_SPECIAL + 5, 8),))
    catalogue = {"product_type": torch.cat([torch.zeros(N_SPECIAL, dtype=torch.long),
                                            N_SPECIAL + torch.arange(N_ITEMS - N_SPECIAL) % 5])}  # fmt: skip
    for name, train_cfg in (("off", cfg), ("on", dropped)):
        torch.manual_seed(0)
        model = build_model(TINY, "global_state_attrs", N_ITEMS, SPEC, attributes)
        model.set_catalogue(catalogue)
        fit(model, train, val, train_cfg, tmp_path / f"attrs-{name}", seed=0)
        assert model.attributes.id_dropout == train_cfg.id_dropout
        trained[name] = model.state_dict()
    assert not torch.equal(trained["off"]["item_embeddings.weight"], trained["on"]["item_embeddings.weight"])
    assert training.run_key(model, dropped, 0, train, val, "cpu")["train"]["id_dropout"] == 0.5


def test_auto_id_dropout_is_the_validation_articles_share_without_an_id(tmp_path):
    """id_dropout "auto": the share of the validation outfits' articles whose catalogue index has no id embedding
    (>= n_ids), 0 where every one has an id; the rate trained with is in metrics.json."""
    from contextual_bert.model import build_model

    attributes = ContextSpec((FeatureSpec("product_type", "categorical", "article", N_SPECIAL + 5, 8),))
    n_catalogue = N_ITEMS + 10  # 10 articles without an id embedding (unseen in training)
    catalogue = {"product_type": torch.cat([torch.zeros(N_SPECIAL, dtype=torch.long),
                                            N_SPECIAL + torch.arange(n_catalogue - N_SPECIAL) % 5])}  # fmt: skip
    model = build_model(TINY, "none_attrs", N_ITEMS, SPEC, attributes)
    model.set_catalogue(catalogue)
    val = planted(40, 1)
    real = int((val.items >= N_SPECIAL).sum())
    assert training.id_dropout_rate(0.3, model, val) == 0.3
    assert training.id_dropout_rate("auto", model, val) == 0.0  # every article has an id: nothing to drop for
    items = val.items.clone()
    first = (items >= N_SPECIAL).nonzero()[: real // 4]  # a quarter of the articles become unseen ones
    items[first[:, 0], first[:, 1]] = N_ITEMS + first[:, 0] % 10
    unseen = EncodedOutfits(items, val.context)
    assert training.id_dropout_rate("auto", model, unseen) == pytest.approx((real // 4) / real)

    cfg = SHORT.model_copy(update={"max_epochs": 1, "id_dropout": "auto"})
    metrics = fit(model, planted(200, 0), unseen, cfg, tmp_path / "auto", seed=0)
    assert metrics["id_dropout"] == pytest.approx((real // 4) / real) == model.attributes.id_dropout


def test_the_bag_warmup_falls_from_one_to_zero_for_the_encoders_only(tmp_path):
    from contextual_bert.model import build_model

    cfg = SHORT.model_copy(update={"bag_warmup_epochs": 2})
    encoder = new_model("concat")
    assert [training.bag_warmup_weight(cfg, encoder, epoch) for epoch in (1, 2, 3, 9)] == [1.0, 0.5, 0.0, 0.0]
    assert training.bag_warmup_weight(SHORT, encoder, 1) == 0.0
    bag = build_model(TINY, "bag_of_items", N_ITEMS, SPEC)
    with_path = ContextualBert(TINY.model_copy(update={"bag_path": "output"}), "none", N_ITEMS, SPEC)
    assert training.bag_warmup_weight(cfg, bag, 1) == 0.0 == training.bag_warmup_weight(cfg, with_path, 1)
    train, val = planted(60, 0), planted(20, 1)
    assert "bag_warmup_epochs" not in training.run_key(bag, cfg, 0, train, val, "cpu")["train"]
    assert training.run_key(encoder, cfg, 0, train, val, "cpu")["train"]["bag_warmup_epochs"] == 2
    assert training.run_key(encoder, SHORT, 0, train, val, "cpu")["train"]["bag_warmup_epochs"] == 0
    trained = {}  # and fit trains with it: one epoch at weight 1 ends elsewhere than one without
    for name, train_cfg in (("off", SHORT), ("on", cfg)):
        model = new_model("concat")
        fit(model, train, val, train_cfg.model_copy(update={"max_epochs": 1}), tmp_path / name, seed=0)
        trained[name] = model.state_dict()["item_embeddings.weight"]
    assert not torch.equal(trained["off"], trained["on"])


def test_the_stuck_check_starts_the_warmup_only_for_an_encoder_that_does_not_read_the_outfit(tmp_path, monkeypatch):
    import contextual_bert.evaluation.ranking as ranking

    train, val = planted(300, 0), planted(60, 1)  # 10 steps an epoch: checked at the end of epoch 2
    checked = SHORT.model_copy(update={"max_epochs": 5, "patience": 9, "bag_warmup_epochs": 2,
                                       "bag_warmup_check_steps": 15})  # fmt: skip
    runs = {}
    for name, threshold in (("reads", -math.inf), ("stuck", math.inf)):  # whatever its measured dependence
        monkeypatch.setattr(ranking, "STUCK_BELOW", threshold)
        model = new_model("global_state", cfg=DROPOUT)
        metrics = fit(model, train, val, checked, tmp_path / name, seed=3)
        history = json.loads((tmp_path / name / "curve.json").read_text())
        runs[name] = (model.state_dict(), metrics, history)
    plain = new_model("global_state", cfg=DROPOUT)
    fit(plain, train, val, SHORT.model_copy(update={"max_epochs": 5, "patience": 9}), tmp_path / "plain", seed=3)

    for name in ("reads", "stuck"):
        state, metrics, history = runs[name]
        assert [("outfit_dependence" in row) for row in history] == [False, True, False, False, False]
        assert metrics["bag_warmup"]["checked_at_epoch"] == 2
        assert metrics["bag_warmup"]["outfit_dependence"] == history[1]["outfit_dependence"]
    assert [row["bag_weight"] for row in runs["stuck"][2]] == [0.0, 0.0, 1.0, 0.5, 0.0]
    assert runs["stuck"][1]["bag_warmup"]["from"] == 3
    assert [row["bag_weight"] for row in runs["reads"][2]] == [0.0] * 5
    assert runs["reads"][1]["bag_warmup"]["from"] is None
    # the check draws nothing from the training's random streams: a run it lets be is the run without it, bit for bit
    for name, value in plain.state_dict().items():
        assert torch.equal(value, runs["reads"][0][name]), name
    assert not torch.equal(plain.state_dict()["item_embeddings.weight"], runs["stuck"][0]["item_embeddings.weight"])
    # without check steps the warm-up runs from epoch 1, as before the check existed
    always = training.BagWarmup.at_start(checked.model_copy(update={"bag_warmup_check_steps": None}), plain)
    assert (always.phase, always.start) == ("planned", 1)
    assert training.BagWarmup.at_start(checked, plain).phase == "due"
    assert training.BagWarmup.at_start(SHORT, plain) == training.BagWarmup(start=None)
    assert [training.bag_warmup_weight(checked, plain, epoch, 3) for epoch in (1, 2, 3, 4, 5)] == [0, 0, 1, 0.5, 0]


@pytest.mark.parametrize("lifts", [False, True])
def test_a_warmup_that_does_not_lift_validation_gives_back_what_the_run_had_before_it(tmp_path, monkeypatch, lifts):
    import copy

    import contextual_bert.evaluation.ranking as ranking

    monkeypatch.setattr(ranking, "STUCK_BELOW", math.inf)  # stuck at the check after epoch 2: warm-up in 3-4
    train, val = planted(300, 0), planted(60, 1)
    cfg = SHORT.model_copy(
        update={
            "max_epochs": 4,
            "patience": 9,
            "bag_warmup_epochs": 2,
            "bag_warmup_check_steps": 15,
            "probe_outfits": 60,
        }
    )
    calls = itertools.count(1)
    real = training.trainer.validation_cross_entropy

    def validation(model, data, *args):  # two passes an epoch: validation (odd), the training probe (even)
        value, call = real(model, data, *args), next(calls)
        worse = call in ((1, 3) if lifts else (5, 7))  # before the warm-up, or in it
        return value + 10.0 if worse else value

    monkeypatch.setattr(training.trainer, "validation_cross_entropy", validation)
    before = {}

    def keep(epoch, row):
        if epoch == 2:
            before["model"] = copy.deepcopy(model.state_dict())
            before["optimizer"] = torch.load(tmp_path / "last.pt", weights_only=True)["optimizer"]
            before["scheduler"] = torch.load(tmp_path / "last.pt", weights_only=True)["scheduler"]

    model = new_model("global_state", cfg=DROPOUT)
    metrics = fit(model, train, val, cfg, tmp_path, seed=3, on_epoch_end=keep)
    history = json.loads((tmp_path / "curve.json").read_text())
    last = torch.load(tmp_path / "last.pt", weights_only=True)
    assert [row["bag_weight"] for row in history] == [0.0, 0.0, 1.0, 0.5]
    assert metrics["bag_warmup"]["lifted"] is lifts and last["state"]["bag_warmup"]["before"] is None
    assert history[3]["bag_warmup_restored"] is (not lifts)
    same = [torch.equal(value, before["model"][name]) for name, value in model.state_dict().items()]
    if lifts:
        assert not all(same)
        return
    assert all(same)  # the warm-up's weights, optimizer and schedule given back: the paper's model goes on
    assert last["scheduler"] == before["scheduler"]
    for index, moments in before["optimizer"]["state"].items():
        for name, value in moments.items():
            assert torch.equal(last["optimizer"]["state"][index][name], value), (index, name)


def test_the_warmup_loss_at_weight_one_is_the_bag_paths_and_at_zero_the_papers():
    torch.manual_seed(0)
    paper = new_model("global_state")
    with_path = ContextualBert(TINY.model_copy(update={"bag_path": "output"}), "global_state", N_ITEMS, SPEC)
    with_path.load_state_dict(paper.state_dict())
    data = planted(64, 3)
    inputs, predict = mask_items(data.items, N_ITEMS, SHORT, torch.Generator().manual_seed(0))

    def loss(model, weight):
        training.set_bag_weight(model, weight)  # the warm-up is a training mode: the model reads it in training
        return training.masked_item_loss(model, inputs, data.context, predict, data.items)

    losses = {name: loss(model, weight)
              for name, model, weight in (("paper", paper, 0.0), ("warm", paper, 1.0), ("path", with_path, 0.0),
                                          ("half", paper, 0.5))}  # fmt: skip
    torch.testing.assert_close(losses["warm"], losses["path"])
    assert len({round(v.item(), 6) for v in losses.values()}) == 3  # the paper's, the half and the full bag


def test_early_stopping_keeps_the_best_epoch(tmp_path, monkeypatch):
    curve = iter([3.0, 2.5, 2.6, 2.7, 2.4, 2.3])
    calls = itertools.count()
    # Each epoch measures the validation split, then the training sample: the first follows the curve.
    monkeypatch.setattr(training.trainer, "validation_cross_entropy",
                        lambda *args: next(curve) if next(calls) % 2 == 0 else 9.0)  # fmt: skip
    train, val = planted(100, 0), planted(20, 1)
    cfg = SHORT.model_copy(update={"max_epochs": 6, "patience": 2, "probe_outfits": 20})
    metrics = fit(new_model("none"), train, val, cfg, tmp_path, seed=0)
    assert (metrics["epochs"], metrics["best_epoch"], metrics["best_val_cross_entropy"]) == (4, 2, 2.5)
    assert metrics["stopped_early"] and metrics["converged"] == "early_stopping"
    _, meta = load_checkpoint(tmp_path / "checkpoint.pt")
    assert meta["epoch"] == 2
    # A longer patience revives a run that stopped early: it goes on as a run with that patience from the start
    # would (here to max_epochs, the curve improving again), so the patience in dvc.lock is the one it trained with.
    again = fit(new_model("none"), train, val, cfg.model_copy(update={"patience": 5}), tmp_path, seed=0)
    assert (again["epochs"], again["best_epoch"], again["stopped_early"]) == (6, 6, False)


def test_an_epoch_validates_on_a_fixed_sample_and_probes_at_most_probe_outfits(tmp_path, monkeypatch):
    """On a large split both passes rank every article: each epoch reads the same evenly spaced validation
    sample, and a training probe no larger than probe_outfits (nor than that sample)."""
    sizes = []
    real = training.trainer.validation_cross_entropy

    def measured(model, data, *args):
        sizes.append((len(data), data.items.sum().item()))
        return real(model, data, *args)

    monkeypatch.setattr(training.trainer, "validation_cross_entropy", measured)
    train, val = planted(100, 0), planted(40, 1)
    fit(
        new_model("none"),
        train,
        val,
        SHORT.model_copy(update={"max_epochs": 2, "validation_outfits": 10, "probe_outfits": 7}),
        tmp_path,
        seed=0,
    )
    sample = training.even_sample(val, 10)
    assert sizes[0] == sizes[2] == (10, sample.items.sum().item())  # validation: the same sample each epoch
    assert sizes[1][0] == sizes[3][0] == 7  # the probe
    sizes.clear()
    fit(
        new_model("none"),
        train,
        val,
        SHORT.model_copy(update={"max_epochs": 1, "validation_outfits": 0, "probe_outfits": 1000}),
        tmp_path / "all",
        seed=0,
    )
    assert [n for n, _ in sizes] == [40, 40]  # 0: every validation outfit; the probe as many training outfits


def test_the_training_probe_is_a_diagnostic_the_run_is_the_same_bits_without_it(tmp_path):
    train, val = planted(200, 0), planted(40, 1)
    runs = {}
    for probe in (0, 25):
        model = new_model("global_state", cfg=DROPOUT)
        metrics = fit(
            model, train, val, SHORT.model_copy(update={"probe_outfits": probe}), tmp_path / str(probe), seed=1
        )
        runs[probe] = (model.state_dict(), metrics, json.loads((tmp_path / str(probe) / "curve.json").read_text()))
    (without, metrics_without, curve_without), (with_probe, metrics_with, curve_with) = runs[0], runs[25]
    for name, value in without.items():
        assert torch.equal(value, with_probe[name]), name
    assert metrics_without["best_val_cross_entropy"] == metrics_with["best_val_cross_entropy"]
    assert all("train_cross_entropy" not in row for row in curve_without)
    assert all(math.isfinite(row["train_cross_entropy"]) for row in curve_with)


def test_convergence_is_early_stopping_or_a_plateau_of_three_epochs():
    rows = lambda *values: [{"val_cross_entropy": v} for v in values]  # noqa: E731
    assert training.convergence(rows(3.0, 2.5), stopped_early=True) == "early_stopping"
    assert training.convergence(rows(3.0, 2.5, 2.4), stopped_early=False) is None  # too short to tell
    assert training.convergence(rows(3.0, 2.5, 2.497, 2.495, 2.491), stopped_early=False) == "plateau"
    assert training.convergence(rows(3.0, 2.5, 2.497, 2.495, 2.489), stopped_early=False) is None  # 0.011
    assert training.convergence(rows(3.0, 2.5, 2.6, 2.7, 2.55), stopped_early=False) == "plateau"


def test_the_learning_rate_warms_up_then_decays_to_its_floor():
    cosine = TrainConfig(lr_warmup_steps=4, schedule="cosine", min_lr_fraction=0.1)
    factor = training.lr_factor(cosine, total_steps=14)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    decay = [factor(s) for s in range(4, 15)]
    assert decay[0] == 1.0 and all(a > b for a, b in zip(decay, decay[1:]))  # strictly falling from the peak
    assert decay[5] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # half-way: the midpoint
    assert decay[-1] == pytest.approx(0.1) and factor(100) == pytest.approx(0.1)  # held at the floor
    linear = training.lr_factor(cosine.model_copy(update={"schedule": "linear", "min_lr_fraction": 0.0}), 14)
    assert linear(9) == pytest.approx(0.5) and linear(14) == pytest.approx(0.0)
    constant = training.lr_factor(cosine.model_copy(update={"schedule": "constant"}), 14)
    assert [constant(s) for s in (3, 4, 13, 100)] == [1.0, 1.0, 1.0, 1.0]
    assert training.lr_factor(TrainConfig(lr_warmup_steps=0), 10)(0) == 1.0


def test_the_optimizer_follows_the_schedule_and_clips_the_gradient(tmp_path):
    train, val = planted(64, 0), planted(20, 1)
    cfg = SHORT.model_copy(update={"batch_size": 16, "max_epochs": 2, "lr_warmup_steps": 2, "grad_clip": 1e-3})
    history = []
    fit(new_model("none"), train, val, cfg, tmp_path, seed=0, on_epoch_end=lambda e, row: history.append(row))
    factor = training.lr_factor(cfg, total_steps=8)
    assert [row["learning_rate"] for row in history] == pytest.approx(
        [cfg.learning_rate * factor(3), cfg.learning_rate * factor(7)]
    )
    # One plain SGD step at lr 1 from the same weights, unclipped and clipped: the step is the gradient.
    model, clipped = new_model("none"), new_model("none")
    clipped.load_state_dict(model.state_dict())
    grads = []
    for net, clip in ((model, 0.0), (clipped, 1e-3)):
        opt = torch.optim.SGD(net.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        before = [p.detach().clone() for p in net.parameters()]
        training.train_step(
            net,
            opt,
            sched,
            train.items[:16],
            {k: v[:16] for k, v in train.context.items()},
            cfg.model_copy(update={"grad_clip": clip}),
            torch.Generator().manual_seed(0),
        )
        moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(net.parameters(), before)))
        grads.append(float(moved))
    assert grads[1] == pytest.approx(1e-3, rel=1e-3)  # SGD at lr 1: the step is the clipped gradient
    assert grads[0] > 10 * grads[1]


def test_step_loss_is_train_step_s_loss_while_inside_and_masked_item_loss_after():
    # The seam a study trains another objective through (studies/article_vectors/distill.py)
    from contextual_bert.training import loop, losses, step_loss

    train, calls = planted(16, 0), []

    def loss(model, inputs, context, predict, items, sampler=None):
        calls.append(int(predict.sum()))
        return losses.masked_item_loss(model, inputs, context, predict, items, sampler) * 0.0

    model = new_model("none")
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with step_loss(loss):
        training.train_step(model, opt, sched, train.items, train.context, SHORT, torch.Generator().manual_seed(0))
    assert len(calls) == 1 and calls[0] > 0
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # the swapped loss's (zero) gradient
    assert loop.masked_item_loss is losses.masked_item_loss
    with pytest.raises(RuntimeError), step_loss(loss):
        raise RuntimeError
    assert loop.masked_item_loss is losses.masked_item_loss


@pytest.mark.parametrize("loss", [float("inf"), float("nan")])
def test_a_non_finite_validation_loss_is_an_error_never_a_result(tmp_path, monkeypatch, loss):
    """The issue's case: every validation target unknown gave best_val_cross_entropy Infinity and exit 0."""
    from contextual_bert.errors import ContextualBertError

    monkeypatch.setattr(training.trainer, "validation_cross_entropy", lambda *args: loss)
    train, val = planted(100, 0), planted(20, 1)
    with pytest.raises(ContextualBertError, match=rf"validation cross-entropy is {loss} at epoch 1.*min_known_targets"):
        fit(new_model("none"), train, val, SHORT, tmp_path, seed=0)
    assert not (tmp_path / "checkpoint.pt").exists() and not (tmp_path / "metrics.json").exists()


def test_a_later_non_finite_epoch_keeps_the_finite_best(tmp_path, monkeypatch):
    curve, calls = iter([3.0, float("nan"), float("nan")]), itertools.count()
    # Each epoch measures the validation split, then the training sample: the first follows the curve.
    monkeypatch.setattr(training.trainer, "validation_cross_entropy",
                        lambda *args: next(curve) if next(calls) % 2 == 0 else 9.0)  # fmt: skip
    train, val = planted(100, 0), planted(20, 1)
    metrics = fit(new_model("none"), train, val, SHORT.model_copy(update={"patience": 2}), tmp_path, seed=0)
    assert (metrics["best_epoch"], metrics["best_val_cross_entropy"]) == (1, 3.0)


def test_length_batches_cover_every_outfit_once_with_less_padding():
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 9, (1000,), generator=generator)
    order = torch.randperm(1000, generator=generator)
    state = generator.get_state()
    batches = length_batches(order, lengths, 64, generator)
    assert len(batches) == math.ceil(1000 / 64)
    assert sorted(torch.cat(batches).tolist()) == list(range(1000))
    padded = sum(len(b) * int(lengths[b].max()) for b in batches)
    plain = sum(len(b) * int(lengths[b].max()) for b in order.split(64))
    assert padded < 0.8 * plain  # slots computed, padding included
    # the same generator state gives the same batches (exact resume)
    again = length_batches(order, lengths, 64, torch.Generator().set_state(state))
    assert all(torch.equal(a, b) for a, b in zip(again, batches, strict=True))


def test_a_last_pt_of_another_version_is_never_resumed(tmp_path):
    """last.pt from before the checkpoint version (or of another): refused with a one-line warning naming its
    version, the run's files removed and the run started afresh, the same as one that never had it."""
    from contextual_bert.model import CHECKPOINT_VERSION

    train, val = planted(120, 0), planted(30, 1)
    cfg = SHORT.model_copy(update={"max_epochs": 1})
    fresh = fit(new_model("none"), train, val, cfg, tmp_path / "fresh", seed=0)
    fit(new_model("none"), train, val, cfg, tmp_path / "old", seed=0)
    last = torch.load(tmp_path / "old" / "last.pt", weights_only=True)
    torch.save({k: v for k, v in last.items() if k != "version"}, tmp_path / "old" / "last.pt")
    with pytest.warns(
        UserWarning,
        match=rf"last\.pt: resume state version None \(this code reads version "
        rf"{CHECKPOINT_VERSION}\); not resumed, the run starts afresh$",
    ):
        again = fit(new_model("none"), train, val, cfg, tmp_path / "old", seed=0)
    assert again["epochs"] == 1 and again["best_val_cross_entropy"] == fresh["best_val_cross_entropy"]
    assert torch.load(tmp_path / "old" / "last.pt", weights_only=True)["version"] == CHECKPOINT_VERSION
