"""The CUDA path: bf16 autocast, fused AdamW, data and the run's generator on the device.

CI has no GPU, so these skip there; `benchmarks/cuda_check.sh` runs them on a GPU machine (docs/training.md).
They check what the CPU tests cannot: that training on the device learns, with either softmax, that its
checkpoint serves on the CPU, that the device's forward pass and evaluation agree with the CPU's, and that a
killed CUDA run resumes where an uninterrupted one ends.
"""

import json

import pytest
import torch
from test_training import DROPOUT, PLANTED_TRAIN, SHORT, new_model, planted

from contextual_bert.data.feature_spec import MASK_INDEX
from contextual_bert.devices import autocast
from contextual_bert.evaluation.ranking import case_ranks
from contextual_bert.model import load_checkpoint
from contextual_bert.training import fit

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
CUDA = torch.device("cuda")


@pytest.mark.parametrize("softmax", ["full", "sampled"])
def test_training_on_cuda_learns_the_planted_signal_and_serves_on_the_cpu(tmp_path, softmax):
    train, val, test = planted(2000, 0), planted(300, 1), planted(400, 2)
    cfg = PLANTED_TRAIN.model_copy(update={"device": "cuda", "softmax": softmax, "negatives": 16})  # of 38 articles
    metrics = fit(new_model("global_state"), train, val, cfg, tmp_path, seed=0)
    assert metrics["device"] == "cuda"
    history = json.loads((tmp_path / "curve.json").read_text())
    assert all(torch.isfinite(torch.tensor(row["train_loss"])) for row in history)
    best, _ = load_checkpoint(tmp_path / "checkpoint.pt")  # on the CPU, as serving loads it
    cases = case_ranks(best, test, 512, "cpu")
    # as the CPU test of this data: without the context at best ~1.91 nats, with it ln 4 ~ 1.39
    assert -cases["log_prob"].mean() < 1.8


def test_the_forward_pass_on_cuda_agrees_with_the_cpu():
    model = new_model("global_state").eval()
    data = planted(256, 3)
    items = data.items.clone()
    items[:, 0] = MASK_INDEX
    with torch.no_grad():
        on_cpu = model.masked_logits(items, data.context).log_softmax(-1)
        model.to(CUDA)
        context = {k: v.to(CUDA) for k, v in data.context.items()}
        fp32 = model.masked_logits(items.to(CUDA), context).log_softmax(-1).cpu()
        with autocast(CUDA):  # how training and serving run there
            bf16 = model.masked_logits(items.to(CUDA), context).float().log_softmax(-1).cpu()
    real = on_cpu.isfinite()  # the special tokens' logits are -inf on every device
    for on_cuda, atol in ((fp32, 1e-3), (bf16, 0.1)):
        assert torch.equal(on_cuda.isfinite(), real)
        assert (on_cuda[real] - on_cpu[real]).abs().max() < atol


def test_evaluation_on_cuda_matches_the_cpu():
    model = new_model("concat").eval()
    data = planted(500, 4)
    on_cpu = case_ranks(model, data, 128, "cpu")
    on_cuda = case_ranks(model.to(CUDA), data, 128, CUDA)
    assert torch.allclose(torch.as_tensor(on_cuda["log_prob"]), torch.as_tensor(on_cpu["log_prob"]), atol=1e-4)
    assert (torch.as_tensor(on_cuda["rank"]) == torch.as_tensor(on_cpu["rank"])).float().mean() > 0.99


def test_a_killed_cuda_run_resumes_where_an_uninterrupted_one_ends(tmp_path):
    train, val = planted(300, 0), planted(60, 1)
    cfg = SHORT.model_copy(update={"device": "cuda", "bag_warmup_epochs": 2})  # resumed inside the warm-up
    whole = new_model("global_state_update", cfg=DROPOUT)
    fit(whole, train, val, cfg, tmp_path / "whole", seed=7)

    def kill(epoch, row):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(new_model("global_state_update", cfg=DROPOUT), train, val, cfg, tmp_path / "resumed", seed=7,
            on_epoch_end=kill)  # fmt: skip
    resumed = new_model("global_state_update", seed=2, cfg=DROPOUT)
    fit(resumed, train, val, cfg, tmp_path / "resumed", seed=7)
    history = [json.loads((tmp_path / run / "curve.json").read_text()) for run in ("whole", "resumed")]
    assert [row["val_cross_entropy"] for row in history[0]] == [row["val_cross_entropy"] for row in history[1]]
    for name, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
