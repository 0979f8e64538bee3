"""The offset of the articles without an id, fitted on validation after training (training/unseen_fit.py): the
one-variable optimum, and a trained "_attrs" model whose best checkpoint carries the fitted offset."""

import math

import numpy as np
import pytest
import torch
from helpers import PLAIN_TRAIN

from contextual_bert.config import ModelConfig, TrainConfig
from contextual_bert.data.feature_spec import N_SPECIAL, PAD_INDEX, ContextSpec, EncodedOutfits, FeatureSpec
from contextual_bert.model import build_model, load_checkpoint
from contextual_bert.training import fit
from contextual_bert.training.loop import validation_cross_entropy
from contextual_bert.training.unseen_fit import best_delta

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=16, dropout=0.0, max_set_size=6)
SHORT = TrainConfig(batch_size=32, max_epochs=3, lr_warmup_steps=2, device="cpu", id_dropout=0.3, **PLAIN_TRAIN)
N_IDS = N_SPECIAL + 16  # articles bought in training
N_ITEMS = N_IDS + 8  # and eight that only validation holds
ATTRIBUTES = ContextSpec((FeatureSpec("clip", "vector", "article", 0, 8, 3),))


def test_the_delta_brings_the_mean_mass_to_the_share_of_targets_without_an_id():
    mass, unseen = np.full(1000, 0.1), np.arange(1000) < 300  # 10% of the mass, 30% of the targets
    delta, before, after = best_delta(np.full(1000, -3.0), mass, unseen)
    assert delta == pytest.approx(math.log(0.3 * 0.9 / (0.1 * 0.7)), abs=1e-9)
    moved = mass * math.exp(delta) / (1 - mass + mass * math.exp(delta))
    assert moved.mean() == pytest.approx(0.3) and after < before


def test_a_calibrated_model_keeps_its_offset():
    mass, unseen = np.full(100, 0.25), np.arange(100) < 25
    assert best_delta(np.full(100, -2.0), mass, unseen) == (0.0, 2.0, 2.0)


def outfits(n: int, seed: int, top: int) -> EncodedOutfits:
    g = torch.Generator().manual_seed(seed)
    items = torch.full((n, TINY.max_set_size), PAD_INDEX, dtype=torch.long)
    items[:, :4] = N_SPECIAL + torch.rand(n, top - N_SPECIAL, generator=g).argsort(dim=1)[:, :4]
    return EncodedOutfits(items, {})


def vector_model():
    torch.manual_seed(0)
    model = build_model(TINY, "none_attrs", N_IDS, ContextSpec(()), ATTRIBUTES)
    clip = torch.randn(N_ITEMS, 3, generator=torch.Generator().manual_seed(0))
    clip[:N_SPECIAL] = float("nan")
    model.set_catalogue({"clip": clip})
    return model


def test_the_best_checkpoint_carries_the_offset_fitted_on_validation_and_a_finished_run_fits_the_same(tmp_path):
    train, val = outfits(160, 0, N_IDS), outfits(40, 1, N_ITEMS)  # a third of validation's articles have no id
    metrics = fit(vector_model(), train, val, SHORT, tmp_path, seed=0)
    fitted = metrics["unseen_offset_fit"]
    assert metrics["unseen_offset"] == fitted["offset"] != fitted["start"]
    assert fitted["val_cross_entropy_after"] < fitted["val_cross_entropy_before"]
    model, meta = load_checkpoint(tmp_path / "checkpoint.pt")
    assert model.attributes.unseen_offset == fitted["offset"] and meta["unseen_offset_fit"] == fitted
    assert validation_cross_entropy(model, val, 64, "cpu") == pytest.approx(fitted["val_cross_entropy_after"], abs=1e-6)
    assert fit(vector_model(), train, val, SHORT, tmp_path, seed=0) == metrics  # from the same start: the same fit


def test_a_model_whose_articles_all_have_an_id_gets_no_fit(tmp_path):
    train, val = outfits(160, 0, N_IDS), outfits(40, 1, N_IDS)
    metrics = fit(vector_model(), train, val, SHORT, tmp_path, seed=0)
    assert "unseen_offset_fit" not in metrics
