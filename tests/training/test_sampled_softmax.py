"""The sampled softmax (train.softmax: sampled): its loss, its candidates, its log-Q correction, and training
with it (resume included)."""

import json

import pytest
import torch
import torch.nn.functional as F
from helpers import PLAIN_TRAIN
from test_training import DROPOUT, N_ITEMS, PLANTED_TRAIN, SPEC, TINY, new_model, planted

from contextual_bert import cpu_kernels
from contextual_bert.config import Config, TrainConfig
from contextual_bert.data.feature_spec import N_SPECIAL, ContextSpec, FeatureSpec
from contextual_bert.model import AttributeOverlap, build_model
from contextual_bert.training import (
    LinearCrossEntropy,
    NegativeSampler,
    fit,
    mask_items,
    masked_item_loss,
    sampled_cross_entropy,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ATTRIBUTES = ContextSpec(
    (
        FeatureSpec("product_type", "categorical", "article", N_SPECIAL + 5, 8),
        FeatureSpec("colour", "multi_categorical", "article", N_SPECIAL + 4, 8, max_values=2),
    )
)


def attribute_model(model_name: str):
    torch.manual_seed(0)
    model = build_model(TINY.model_copy(update={"attribute_overlap": True}), model_name, N_ITEMS, SPEC, ATTRIBUTES)
    n = N_ITEMS + 6  # six articles without an id
    g = torch.Generator().manual_seed(1)
    model.set_catalogue(
        {
            "product_type": torch.randint(1, N_SPECIAL + 5, (n,), generator=g),
            "colour": torch.randint(0, N_SPECIAL + 4, (n, 2), generator=g),
        }
    )
    with torch.no_grad():  # offsets away from their zero start, so that they count
        for offset in model.reader(AttributeOverlap).offsets:
            offset.normal_(0, 0.1, generator=g)
    return model


def loss_and_grads(model, inputs, context, predict, items, sampler):
    model.zero_grad()
    torch.manual_seed(5)  # the same dropout in both
    loss = masked_item_loss(model, inputs, context, predict, items, sampler)
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "model_name",
    [
        "global_state_update",
        "bag_of_items_context",
        "none_attrs",
        "global_state_two_way_attrs",
        "adaptive_norm_attrs",
        "bag_of_items_attrs",
    ],
)
def test_the_sampled_loss_with_every_article_as_a_negative_equals_the_full_loss(model_name):
    torch.manual_seed(0)
    model = (
        attribute_model(model_name)
        if model_name.endswith("_attrs")
        else build_model(DROPOUT, model_name, N_ITEMS, SPEC)
    )
    model.train()
    data = planted(40, 0)
    inputs, predict = mask_items(
        data.items, model.n_items, TrainConfig(mask_prob=0.5), torch.Generator().manual_seed(0)
    )
    counts = torch.bincount(data.items.reshape(-1), minlength=model.n_items)
    sampler = NegativeSampler(counts, model.n_items - N_SPECIAL, torch.Generator().manual_seed(0))
    full, full_grads = loss_and_grads(model, inputs, data.context, predict, data.items, None)
    sampled, sampled_grads = loss_and_grads(model, inputs, data.context, predict, data.items, sampler)
    torch.testing.assert_close(sampled, full)
    assert full_grads.keys() == sampled_grads.keys()
    for name in full_grads:
        torch.testing.assert_close(sampled_grads[name], full_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    if not model_name.endswith("_attrs"):  # both the fused CPU loss (LinearCrossEntropy)
        assert torch.equal(sampled, full)
        if cpu_kernels.cpu()["vendor"] == "GenuineIntel":  # the same bits, measured on Intel Xeon
            assert all(torch.equal(sampled_grads[name], full_grads[name]) for name in full_grads)
        for name in full_grads:  # elsewhere (AMD EPYC): the output bias's gradient 0.26 of an ulp of its largest
            ulp = torch.finfo(torch.float32).eps * full_grads[name].abs().max()
            assert (sampled_grads[name] - full_grads[name]).abs().max() <= ulp, name


def test_fewer_negatives_score_fewer_articles_and_differ_from_the_full_loss():
    model = new_model("none")
    data = planted(40, 0)
    inputs, predict = mask_items(data.items, N_ITEMS, TrainConfig(), torch.Generator().manual_seed(0))
    counts = torch.bincount(data.items.reshape(-1), minlength=N_ITEMS)
    sampler = NegativeSampler(counts, 3, torch.Generator().manual_seed(0))
    candidates, log_inclusion, _ = sampler.draw(data.items[predict])
    assert len(candidates) < N_ITEMS - N_SPECIAL and (log_inclusion < 0).any()
    full = masked_item_loss(model, inputs, data.context, predict, data.items)
    sampled = masked_item_loss(model, inputs, data.context, predict, data.items, sampler)
    assert float(sampled.detach()) != pytest.approx(float(full), abs=1e-4)
    with torch.no_grad():  # without gradients (validation) the loss is always the full one
        torch.testing.assert_close(
            masked_item_loss(model, inputs, data.context, predict, data.items, sampler),
            masked_item_loss(model, inputs, data.context, predict, data.items),
        )


def skewed_sampler(n_real: int, negatives: int, seed: int = 0) -> NegativeSampler:
    counts = torch.zeros(N_SPECIAL + n_real, dtype=torch.long)
    counts[N_SPECIAL:] = (1000 / torch.arange(1, n_real + 1) ** 1.5).long()  # Zipf: one article dominates
    return NegativeSampler(counts, negatives, torch.Generator().manual_seed(seed))


def test_the_target_is_always_scored_once_among_distinct_candidates():
    sampler = skewed_sampler(200, 5)
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        targets = N_SPECIAL + torch.randint(150, 200, (7,), generator=g)  # rare articles, seldom drawn
        candidates, log_inclusion, columns = sampler.draw(targets)
        assert torch.equal(candidates[columns], targets)
        assert torch.equal(candidates, torch.unique(candidates)) and len(log_inclusion) == len(candidates)
        assert (candidates >= N_SPECIAL).all() and (candidates < N_SPECIAL + 200).all()


def test_the_inclusion_probabilities_are_the_sampler_s_own():
    """With one target, log pi_j is exactly log P(j among the K draws): measured over many draws."""
    n_real, draws = 30, 4000
    sampler = skewed_sampler(n_real, 4)
    target = torch.tensor([N_SPECIAL + n_real - 1])
    included, log_pi = torch.zeros(n_real), torch.zeros(n_real)
    for _ in range(draws):
        candidates, log_inclusion, _ = sampler.draw(target)
        included[candidates - N_SPECIAL] += 1
        log_pi[candidates - N_SPECIAL] = log_inclusion
    others = torch.arange(n_real - 1)
    seen = others[included[others] > 50]
    assert len(seen) > 5
    torch.testing.assert_close(included[seen] / draws, log_pi[seen].exp(), atol=0.025, rtol=0.1)


def test_the_log_q_correction_makes_the_partition_estimate_unbiased():
    """A skewed sampler draws the popular articles far more often than the rare ones. Uncorrected, the
    sampled softmax's normaliser over-weights what is drawn and misses the rest; with the log-Q correction,
    exp(loss + z_t) is an unbiased estimate of the full normaliser sum_j exp(z_j)."""
    n_real = 60
    sampler = skewed_sampler(n_real, 6)
    g = torch.Generator().manual_seed(2)
    z = torch.randn(n_real, generator=g) * 2.0
    z[40:] += 2.0  # the rare articles carry most of the mass
    target = torch.tensor([N_SPECIAL + 5])
    full_normaliser = z.exp().sum()
    corrected, uncorrected = [], []
    for _ in range(6000):
        candidates, log_inclusion, columns = sampler.draw(target)
        logits = z[candidates - N_SPECIAL][None, :]
        corrected.append(sampled_cross_entropy(logits, log_inclusion, columns))
        uncorrected.append(F.cross_entropy(logits, columns))
    z_t = z[5]
    corrected_normaliser = (torch.stack(corrected) + z_t).exp().mean()
    uncorrected_normaliser = (torch.stack(uncorrected) + z_t).exp().mean()
    assert float(corrected_normaliser / full_normaliser) == pytest.approx(1.0, abs=0.05)
    assert float(uncorrected_normaliser / full_normaliser) < 0.5


def test_the_fused_sampled_loss_equals_the_plain_corrected_one_with_gradients():
    """The CPU's sampled loss (LinearCrossEntropy with the log-Q shift, with and without per-row offsets)
    against sampled_cross_entropy over F.linear (+ the offsets): one sampler's draw, two rows sharing a target
    (each one's target a negative of the others), chunks smaller than the rows."""
    sampler = skewed_sampler(200, 40)
    g = torch.Generator().manual_seed(3)
    targets = torch.randint(N_SPECIAL, N_SPECIAL + 200, (37,), generator=g)
    targets[1] = targets[0]
    candidates, log_inclusion, columns = sampler.draw(targets)
    assert log_inclusion.min() < -1.0  # a real correction: some candidates are far from certain
    weight = torch.randn(len(candidates), 16, generator=g).requires_grad_()
    bias = torch.randn(len(candidates), generator=g).requires_grad_()
    h = torch.randn(len(targets), 16, generator=g).requires_grad_()
    offsets = torch.randn(len(targets), len(candidates), generator=g).requires_grad_()  # as outfit_offsets'

    def with_grads(loss, *inputs):
        return loss.detach(), torch.autograd.grad(loss, (h, weight, bias, *inputs))

    for extra in ((), (offsets,)):
        fused = with_grads(LinearCrossEntropy.apply(h, weight, bias, columns, 0, 8, -log_inclusion, *extra), *extra)
        logits = F.linear(h, weight, bias) + (extra[0] if extra else 0)
        plain = with_grads(sampled_cross_entropy(logits, log_inclusion, columns), *extra)
        torch.testing.assert_close(fused[0], plain[0])
        for a, b in zip(fused[1], plain[1], strict=True):
            torch.testing.assert_close(a, b)
    corrected = LinearCrossEntropy.apply(h, weight, bias, columns, 0, 8, -log_inclusion)
    uncorrected = LinearCrossEntropy.apply(h, weight, bias, columns, 0, 8, None)
    assert float(uncorrected) < float(corrected) - 0.5  # the shift is applied, not dropped


def test_every_article_as_a_negative_is_the_full_softmax_without_a_draw():
    sampler = skewed_sampler(10, 10)
    state = sampler.generator.get_state()
    candidates, log_inclusion, columns = sampler.draw(torch.tensor([N_SPECIAL + 3, N_SPECIAL + 3]))
    assert torch.equal(candidates, torch.arange(N_SPECIAL, N_SPECIAL + 10)) and not log_inclusion.any()
    assert columns.tolist() == [3, 3] and torch.equal(sampler.generator.get_state(), state)


SAMPLED = TrainConfig(batch_size=32, max_epochs=3, learning_rate=3e-3, lr_warmup_steps=10, patience=5, device="cpu",
                      **{**PLAIN_TRAIN, "softmax": "sampled"}, negatives=8)  # fmt: skip


def test_a_resumed_sampled_run_ends_where_an_uninterrupted_run_ends(tmp_path):
    train, val = planted(300, 0), planted(60, 1)
    whole = new_model("global_state", cfg=DROPOUT)
    fit(whole, train, val, SAMPLED, tmp_path / "whole", seed=3)

    def kill(epoch, row):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(
            new_model("global_state", cfg=DROPOUT), train, val, SAMPLED, tmp_path / "resumed", seed=3, on_epoch_end=kill
        )
    resumed = new_model("global_state", seed=2, cfg=DROPOUT)
    fit(resumed, train, val, SAMPLED, tmp_path / "resumed", seed=3)
    for name, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    history = [json.loads((tmp_path / run / "curve.json").read_text()) for run in ("whole", "resumed")]
    assert [r["val_cross_entropy"] for r in history[0]] == [r["val_cross_entropy"] for r in history[1]]
    # and the sampled run is not the full one
    full = new_model("global_state", cfg=DROPOUT)
    fit(full, train, val, SAMPLED.model_copy(update={"softmax": "full"}), tmp_path / "full", seed=3)
    assert not torch.equal(full.item_embeddings.weight, whole.item_embeddings.weight)


def test_the_sampled_softmax_learns_the_planted_context_as_the_full_one_does(tmp_path):
    """test_training's planted data, with 8 of the 38 articles drawn per step; validation is the full
    softmax's cross-entropy either way (at 8 epochs both are near 1.88, the untrained model at ~3.6)."""
    train, val = planted(2000, 0), planted(300, 1)
    best = {}
    for softmax in ("full", "sampled"):
        cfg = PLANTED_TRAIN.model_copy(update={"softmax": softmax, "negatives": 8})
        best[softmax] = fit(new_model("global_state_update"), train, val, cfg, tmp_path / softmax,
                            seed=0)["best_val_cross_entropy"]  # fmt: skip
    assert best["full"] < 2.0
    assert best["sampled"] == pytest.approx(best["full"], abs=0.05)


def test_softmax_settings_per_model_and_in_the_run_key():
    cfg = Config.model_validate(
        {
            "train": {"softmax": "full", "negatives": 99},
            "per_model": {"global_state": {"softmax": "sampled", "negatives": 64}},
        }
    )
    assert cfg.train_for("global_state").softmax == "sampled" and cfg.train_for("global_state").negatives == 64
    assert cfg.train_for("none").softmax == "full"
    # a full-softmax run draws no negatives: neither the setting nor its default is in its key
    assert "negatives" not in cfg.train_for("none").read_by("none")
    assert cfg.train_for("global_state").read_by("global_state")["negatives"] == 64
    with pytest.raises(ValueError):
        TrainConfig(negatives=0)


def test_a_sampled_step_builds_attribute_vectors_and_offsets_for_the_candidates_only(monkeypatch):
    """What makes the `_attrs` models' cost independent of the catalogue: no whole-catalogue pass in a step."""
    from contextual_bert.model import ArticleAttributes, AttributeOverlap
    from contextual_bert.training import make_optimizer, train_step

    calls = []
    for cls in (ArticleAttributes, AttributeOverlap):
        original = cls.forward

        def spy(self, *args, _original=original, _name=cls.__name__, **kwargs):
            articles = kwargs.get(
                "articles",
                args[1]
                if _name == "ArticleAttributes" and len(args) > 1
                else args[4]
                if _name == "AttributeOverlap" and len(args) > 4
                else None,
            )
            calls.append((_name, None if articles is None else articles.numel()))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "forward", spy)
    model = attribute_model("global_state_attrs")
    model.set_id_dropout(0.5)
    model.train()
    data = planted(64, 0)
    cfg = TrainConfig(softmax="sampled", negatives=4, device="cpu")
    optimizer = make_optimizer(model, cfg, torch.device("cpu"))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    generator = torch.Generator().manual_seed(0)
    sampler = NegativeSampler(torch.bincount(data.items.reshape(-1), minlength=model.n_items), 4, generator)
    train_step(model, optimizer, scheduler, data.items, data.context, cfg, generator, sampler)
    assert {name for name, _ in calls} == {"ArticleAttributes", "AttributeOverlap"}
    assert all(n is not None for _, n in calls), calls  # the inputs' (B, L) articles, then the candidates
    assert [n < model.n_items - N_SPECIAL for _, n in calls[-2:]] == [True, True], calls
    calls.clear()
    train_step(model, optimizer, scheduler, data.items, data.context, cfg, generator, None)  # the full softmax
    assert ("ArticleAttributes", None) in calls and ("AttributeOverlap", None) in calls
