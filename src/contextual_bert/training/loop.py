"""Masked-item training: the step, its schedule and the validation measure (the loop over them: trainer.py).

Every step masks at least one item of every outfit and minimises the loss over the real articles at the masked
positions (losses.py). AdamW with linear warm-up, then a cosine (or linear) decay to train.min_lr_fraction of
the rate at max_epochs; gradients clipped to a global norm; early stopping on the validation cross-entropy
(every item of every validation outfit masked in turn, as in evaluation).

The objective's loss is not comparable with validation: 10% of the masked positions keep their article, and
several items are masked at once. Every epoch therefore also reports `train_cross_entropy`, the validation's
measure on a fixed sample of training outfits: their gap is the overfitting. A run records whether it
converged: early stopping fired, or its last CONVERGENCE_EPOCHS epochs together improved the best validation
cross-entropy by less than CONVERGENCE_NATS.

Devices: the data is moved to the device once and batches are indexed from it with a shuffled permutation
(no DataLoader), outfits of similar length together and each batch trimmed to its longest (`length_batches`);
fused AdamW. On CUDA, bf16 autocast. On the CPU, fp32, and glibc told to keep freed memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from contextual_bert.config import TrainConfig
from contextual_bert.data.feature_spec import EncodedOutfits
from contextual_bert.devices import autocast
from contextual_bert.training.losses import mask_items, masked_item_loss

CONVERGENCE_EPOCHS, CONVERGENCE_NATS = 3, 0.01


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """Fused AdamW; weight decay on matrices and embeddings only, not on biases and LayerNorm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, fused=True)  # one kernel; 3-4x faster on the CPU


def train_step(model, optimizer, scheduler, items, context, cfg: TrainConfig, generator, sampler=None):
    """One optimisation step on a batch of outfits; returns the loss and the positions predicted. `sampler`:
    the sampled softmax's (`negative_sampler`), None for the full softmax."""
    inputs, predict = mask_items(items, model.n_items, cfg, generator)
    with autocast(items.device):
        loss = masked_item_loss(model, inputs, context, predict, items, sampler)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
    optimizer.step()
    scheduler.step()
    return loss.detach(), predict


@contextmanager
def step_loss(loss: Callable[..., torch.Tensor]) -> Iterator[None]:
    """`train_step` minimises `loss` (losses.masked_item_loss's signature) instead of masked_item_loss while
    inside, in this process: the seam for an objective the library does not have (a study's:
    studies/article_vectors/distill.py). The library never calls it."""
    global masked_item_loss
    kept, masked_item_loss = masked_item_loss, loss
    try:
        yield
    finally:
        masked_item_loss = kept


def lr_factor(cfg: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """The learning rate's multiplier at optimizer step `step` (0-based): linear warm-up over
    cfg.lr_warmup_steps, then cfg.schedule ("cosine", "linear" or "constant") from 1 down to
    cfg.min_lr_fraction at total_steps (and held there)."""
    warmup, floor = cfg.lr_warmup_steps, cfg.min_lr_fraction

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1.0 - progress
        return floor + (1.0 - floor) * decay

    return factor


def convergence(curve: list[dict], stopped_early: bool) -> str | None:
    """How a run converged: "early_stopping", "plateau" (its last CONVERGENCE_EPOCHS epochs improved the
    best validation cross-entropy by less than CONVERGENCE_NATS together), or None (still improving)."""
    if stopped_early:
        return "early_stopping"
    values = [row["val_cross_entropy"] for row in curve]
    if len(values) <= CONVERGENCE_EPOCHS:
        return None
    gained = min(values[:-CONVERGENCE_EPOCHS]) - min(values)
    return "plateau" if gained < CONVERGENCE_NATS else None


def validation_cross_entropy(model, data: EncodedOutfits, batch_size: int, device: torch.device | str) -> float:
    """Mean cross-entropy with every item of every outfit masked in turn (the evaluation's cases)."""
    from contextual_bert.evaluation.ranking import case_ranks

    cases = case_ranks(model, data, batch_size, device, with_ranks=False)
    return float(-cases["log_prob"].mean()) if len(cases["log_prob"]) else float("nan")


def even_sample(train_data: EncodedOutfits, n: int) -> EncodedOutfits:
    """A fixed sample of n outfits of a split, evenly spaced (the split's order is already a hash order)."""
    n = min(n, len(train_data))
    return train_data.subset(torch.linspace(0, len(train_data) - 1, n).round().long().unique())
