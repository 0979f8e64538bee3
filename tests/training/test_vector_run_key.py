"""The run key covers an "_attrs" model's catalogue: a changed article vector (or any attribute value) trains
again, where the same catalogue resumes (training/resume.py)."""

import pytest
import torch
from helpers import PLAIN_TRAIN

import contextual_bert.training as training
from contextual_bert.config import ModelConfig, TrainConfig
from contextual_bert.data.feature_spec import N_SPECIAL, PAD_INDEX, ContextSpec, EncodedOutfits, FeatureSpec
from contextual_bert.model import build_model
from contextual_bert.training import fit

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_ITEMS = N_SPECIAL + 20
TINY = ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=16, dropout=0.0, max_set_size=6)
SHORT = TrainConfig(batch_size=32, max_epochs=2, lr_warmup_steps=2, device="cpu", **PLAIN_TRAIN)
ATTRIBUTES = ContextSpec((FeatureSpec("clip", "vector", "article", 0, 8, 3),))


def outfits(n: int, seed: int) -> EncodedOutfits:
    g = torch.Generator().manual_seed(seed)
    items = torch.full((n, TINY.max_set_size), PAD_INDEX, dtype=torch.long)
    items[:, :4] = N_SPECIAL + torch.rand(n, N_ITEMS - N_SPECIAL, generator=g).argsort(dim=1)[:, :4]
    return EncodedOutfits(items, {})


def vectors(changed: bool = False) -> dict[str, torch.Tensor]:
    clip = torch.randn(N_ITEMS, 3, generator=torch.Generator().manual_seed(0))
    clip[:N_SPECIAL] = float("nan")
    if changed:
        clip[N_SPECIAL + 5, 0] += 0.5  # one number of one article's vector
    return {"clip": clip}


def vector_model(changed: bool = False):
    torch.manual_seed(0)
    model = build_model(TINY, "none_attrs", N_ITEMS, ContextSpec(()), ATTRIBUTES)
    model.set_catalogue(vectors(changed))
    return model


def test_the_run_key_holds_the_catalogue_so_a_changed_vector_trains_again(tmp_path):
    train, val = outfits(120, 0), outfits(30, 1)
    key = training.run_key(vector_model(), SHORT, 0, train, val, "cpu")
    assert key == training.run_key(vector_model(), SHORT, 0, train, val, "cpu")
    assert key["catalogue"] != training.run_key(vector_model(True), SHORT, 0, train, val, "cpu")["catalogue"]
    first = fit(vector_model(), train, val, SHORT, tmp_path, seed=0)
    calls = []
    assert fit(vector_model(), train, val, SHORT, tmp_path, seed=0, on_epoch_end=lambda e, r: calls.append(e)) == first
    assert calls == []  # the same vectors: the finished run stands
    fit(vector_model(True), train, val, SHORT, tmp_path, seed=0, on_epoch_end=lambda e, r: calls.append(e))
    assert calls == [1, 2]  # another vector: trained again
