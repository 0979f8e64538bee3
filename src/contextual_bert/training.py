"""Masked-item training: the loop, its checkpoints and exact resume.

Every step masks at least one item of every outfit (each item with train.mask_prob, at least one), replaces
the masked items BERT-style (80% [MASK], 10% a random article, 10% unchanged) and minimises the full-softmax
cross-entropy over all real articles at the masked positions only; or, with train.softmax: sampled, the
sampled softmax over the step's targets and train.negatives popularity draws, log-Q corrected
(`NegativeSampler`), whose cost does not grow with the catalogue. Validation is the full softmax either way. AdamW with linear warm-up, then a cosine
(or linear) decay to train.min_lr_fraction of the rate at max_epochs; gradients clipped to a global norm;
early stopping on the validation cross-entropy (every item of every validation outfit masked in turn, as in
evaluation).

The objective's loss is not comparable with validation: 10% of the masked positions keep their article, so
the answer is in the input, and several items are masked at once. Every epoch therefore also reports
`train_cross_entropy`, the validation's measure on a fixed sample of training outfits: their gap is the
overfitting. A run records whether it converged: early stopping fired, or its last CONVERGENCE_EPOCHS epochs
together improved the best validation cross-entropy by less than CONVERGENCE_NATS.

Models with article attributes ("_attrs") also train with id dropout (variants.<model>_attrs.id_dropout,
model.ArticleAttributes): a share of the articles is seen by its attributes and the [UNK] id only, so the
attributes learn to rank before the ids memorise. No other model reads the setting: neither its training
nor its run key nor its logged params depend on it.

Determinism: one seed fixes the initial weights (`train`), the shuffling and masking (a generator of its own)
and dropout (the global generator). The thread count is a setting (train.num_threads, a DVC param and part of
the run's key): how a reduction is split over threads changes its rounding, so it is never whatever the machine
offers. torch's deterministic algorithms are on (`pin_threads_and_algorithms`). Two runs of one unit on one
machine give the same bits; what differs between machines is in docs/reproducibility.md.

Exact resume: last.pt holds everything that changes during a run - weights, optimizer, scheduler, every random
stream (the run's generator, torch's, CUDA's, numpy's, Python's), history and early-stopping state - after
every epoch, and within an epoch every train.checkpoint_every_s seconds with the position in the epoch (the
generator's state at the epoch's start, which gives back the epoch's batches, the steps done and the loss
summed so far). A run killed at any moment and resumed ends with the same history, metrics and weights, bit
for bit, as one never interrupted (`save_resume_state` / `load_resume_state`).

Devices: the data is moved to the device once and batches are indexed from it with a shuffled permutation
(no DataLoader), outfits of similar length together and each batch trimmed to its longest
(`length_batches`); fused AdamW. On CUDA, bf16 autocast. On the CPU, fp32, the output layer's loss computed in
chunks of rows (`LinearCrossEntropy`), and glibc told to keep freed memory (`keep_freed_memory`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from contextual_bert import cpu_kernels
from contextual_bert.config import ModelConfig, TrainConfig, base_model, uses_attributes
from contextual_bert.devices import autocast, keep_freed_memory, select_device
from contextual_bert.errors import ContextualBertError
from contextual_bert.feature_spec import HISTORY_FEATURE, MASK_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX, EncodedOutfits
from contextual_bert.model import ContextualBert, atomic_save, build_model, count_paper_parameters, save_checkpoint

EpochHook = Callable[[int, dict], None]

# Settings a run can change and still be resumed: they do not change what an epoch computes. (The device
# the run trains on is part of the key instead: its random streams differ; so is num_threads: it changes the
# rounding.) (max_epochs is not among them: it sets the decay's horizon.)
RESUMABLE_CHANGES = ("variants", "seeds", "patience", "device", "checkpoint_every_s")
CONVERGENCE_EPOCHS, CONVERGENCE_NATS = 3, 0.01
BUCKET_BATCHES = 32  # batches per window sorted by outfit length (length_batches)


# --- masking and the loss -------------------------------------------------------------------------------


def mask_items(
    items: torch.Tensor, n_items: int, cfg: TrainConfig, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the positions to predict and corrupt them BERT-style.

    Returns (inputs, predict): the corrupted items and a bool mask of the positions whose original item is
    the target. Each real, known item is chosen with cfg.mask_prob, and at least one per outfit: the one
    with the smallest draw, so the forced choice is uniform. Unknown articles are never targets.
    """
    device = items.device
    eligible = (items != PAD_INDEX) & (items != UNKNOWN_INDEX)
    draw = torch.rand(items.shape, generator=generator, device=device)
    predict = (draw < cfg.mask_prob) & eligible
    first = torch.where(eligible, draw, 2.0).argmin(dim=1, keepdim=True)
    predict.scatter_(1, first, eligible.any(dim=1, keepdim=True) | predict.gather(1, first))

    how = torch.rand(items.shape, generator=generator, device=device)
    random_items = torch.randint(N_SPECIAL, n_items, items.shape, generator=generator, device=device)
    to_mask = predict & (how < cfg.mask_token_prob)
    to_random = predict & (how >= cfg.mask_token_prob) & (how < cfg.mask_token_prob + cfg.random_token_prob)
    inputs = torch.where(to_random, random_items, items).masked_fill(to_mask, MASK_INDEX)
    return inputs, predict


class LinearCrossEntropy(torch.autograd.Function):
    """mean_i CE(softmax(z_i), t_i), z_i = h_i W^T + b (+ offsets_i), over the rows `first..` of the output
    layer (W, b), computed in chunks of rows of h, with the gradients in the same pass. `shift` (n_cols,) or
    None: added to every column's logit but the row's own target's (the sampled softmax's log-Q correction,
    -log pi). `offsets` (M, n_cols + first) or None: per-row logit offsets (`outfit_offsets`), with gradient.

    The (M, n_articles) logits are the largest tensor of a step (160 MB at the paper's sizes; the sampled
    softmax's (M, C) over 30 MB, and every pass over a fresh one pays its page faults); in chunks they stay in
    cache and are never stored. With E = exp(z - max z) and s its row sum, the gradients are d/dh = E W / s -
    W[t], d/dW = E^T (h / s) - onehot(t)^T h, d/db = E^T (1 / s) - counts(t) and d/d offsets = E / s -
    onehot(t) (the one (M, n_cols) tensor written, and only with offsets), so E is never normalised in place.
    The bias rides in the matmul as a column of W against a column of ones, the shift (a constant) in that
    column. Used on the CPU; `F.cross_entropy` over the same logits computes the same (tests check it).
    """

    @staticmethod
    def forward(ctx, h, full_weight, full_bias, targets, first: int, chunk_rows: int, shift=None,
                full_offsets=None):
        n = h.shape[0]
        weight = full_weight[first:]
        bias = full_bias[first:] if shift is None else full_bias[first:] + shift
        weight_and_bias = torch.cat([weight, bias[:, None]], dim=1)
        h_and_one = F.pad(h, (0, 1), value=1.0)
        grad_h = torch.empty_like(h)
        grad_full_weight, grad_full_bias = torch.zeros_like(full_weight), torch.zeros_like(full_bias)
        grad_weight, grad_bias = grad_full_weight[first:], grad_full_bias[first:]
        offsets = grad_offsets = grad_full_offsets = None
        if full_offsets is not None:
            offsets, grad_full_offsets = full_offsets[:, first:], torch.empty_like(full_offsets)
            grad_full_offsets[:, :first] = 0
            grad_offsets = grad_full_offsets[:, first:]
        loss = torch.zeros((), dtype=torch.float64)
        for start in range(0, n, chunk_rows):
            rows = slice(start, start + chunk_rows)
            columns = targets[rows, None] - first
            exp = torch.mm(h_and_one[rows], weight_and_bias.t())  # the logits z, then E in place
            if offsets is not None:
                exp.add_(offsets[rows])
            target_logit = exp.gather(1, columns)
            if shift is not None:  # a row's own target unshifted
                exp.scatter_(1, columns, target_logit.sub_(shift[columns]))
            row_max = exp.amax(dim=1, keepdim=True)
            exp.sub_(row_max).exp_()
            row_sum = exp.sum(dim=1, keepdim=True)
            loss += (row_max + row_sum.log() - target_logit).sum(dtype=torch.float64)
            inv_sum = row_sum.reciprocal_().div_(n)  # the mean's 1/n folded in
            torch.mm(exp, weight, out=grad_h[rows])
            grad_h[rows].mul_(inv_sum)
            grad_weight.addmm_(exp.t(), h[rows] * inv_sum)
            grad_bias.addmv_(exp.t(), inv_sum.squeeze(1))
            if offsets is not None:
                torch.mul(exp, inv_sum, out=grad_offsets[rows])
        grad_h.sub_(full_weight[targets], alpha=1.0 / n)
        grad_full_weight.index_add_(0, targets, h, alpha=-1.0 / n)
        grad_full_bias.sub_(torch.bincount(targets, minlength=len(full_bias)).to(full_bias.dtype), alpha=1.0 / n)
        if offsets is not None:
            grad_offsets[torch.arange(n, device=h.device), targets - first] -= 1.0 / n
        ctx.save_for_backward(grad_h, grad_full_weight, grad_full_bias, grad_full_offsets)
        return (loss / n).to(h.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        grads = ctx.saved_tensors
        if float(grad_loss) != 1.0:  # as from loss.backward(): no pass over the gradients
            grads = tuple(None if g is None else g * grad_loss for g in grads)
        grad_h, grad_weight, grad_bias, grad_offsets = grads
        return grad_h, grad_weight, grad_bias, None, None, None, None, grad_offsets


LOSS_CHUNK_ROWS = 128  # LinearCrossEntropy's rows per chunk: (128, C) logits stay in a core's cache


def fused_loss_applies(head_states: torch.Tensor) -> bool:
    """LinearCrossEntropy is the CPU's fp32 training loss (autocast's bf16 on CUDA goes the plain way)."""
    return head_states.device.type == "cpu" and head_states.dtype == torch.float32 and torch.is_grad_enabled()


class NegativeSampler:
    """The sampled softmax's candidates for one training step (train.softmax: sampled), shared by its batch.

    Candidates C = the step's masked targets (in-batch negatives for the other rows) plus K = train.negatives
    articles drawn with replacement from q, q_j proportional to (count_j + 1)^SAMPLER_POWER over the real
    articles (count_j: the article's sightings in the training outfits; + 1 so an article absent from them,
    which the `_attrs` models rank, is a negative too; the power flattens popularity as word2vec's 3/4).

    The log-Q correction: row i's softmax is over its target t and C without t, each negative j's logit
    lowered by log pi_j, pi_j the probability that j is among the candidates. Then sum_j exp(z_j) / pi_j
    over the negatives in C is an unbiased (Horvitz-Thompson) estimate of sum_{j != t} exp(z_j), the full
    softmax's, and the loss approaches the full one as C grows (the log of an unbiased estimate is a little
    low, by Jensen). pi_j = 1 - (1 - q_j)^K (1 - p_j)^(M - 1): K popularity draws and the M - 1 other
    targets, taken as draws from the targets' distribution p (the training counts); exact for M = 1. With
    K at least the number of articles, C is every article and pi = 1: the full softmax, exactly.

    Draws come from the training's own generator (`generator`, saved in last.pt): a resumed run repeats them.
    """

    SAMPLER_POWER = 0.75

    def __init__(self, counts: torch.Tensor, negatives: int, generator: torch.Generator):
        """counts: (n_items,) sightings of every catalogue index in the training outfits (specials ignored)."""
        real = counts[N_SPECIAL:].double()
        if len(real) == 0:
            raise ContextualBertError("the sampled softmax needs at least one real article")
        self.n_real, self.negatives, self.generator = len(real), negatives, generator
        q = (real + 1.0) ** self.SAMPLER_POWER
        self.q = (q / q.sum()).float().to(generator.device)
        p = real / real.sum() if real.sum() > 0 else torch.zeros_like(real)
        # log(1 - x), clamped so that 0 draws of a certain article give 0 * (-big) = 0, not nan
        self.log1m_q = torch.log1p(-q / q.sum()).clamp_min(-1e4).to(generator.device)
        self.log1m_p = torch.log1p(-p).clamp_min(-1e4).to(generator.device)

    @classmethod
    def for_training(cls, train_items: torch.Tensor, n_items: int, negatives: int, generator: torch.Generator):
        """From the training outfits' items (catalogue indices, PAD/[UNK] included and ignored)."""
        counts = torch.bincount(train_items.reshape(-1), minlength=n_items)[:n_items].clone()
        counts[:N_SPECIAL] = 0
        return cls(counts, negatives, generator)

    def draw(self, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(candidates (C,) catalogue indices, log pi (C,), target_columns (M,): each target's column in C)."""
        device = targets.device
        if self.negatives >= self.n_real:  # every article: the full softmax
            return (torch.arange(N_SPECIAL, N_SPECIAL + self.n_real, device=device),
                    torch.zeros(self.n_real, device=device), targets - N_SPECIAL)  # fmt: skip
        drawn = torch.multinomial(self.q, self.negatives, replacement=True, generator=self.generator)
        candidates, inverse = torch.unique(torch.cat([targets, drawn.to(device) + N_SPECIAL]), return_inverse=True)
        rows = candidates - N_SPECIAL
        log_not_drawn = self.negatives * self.log1m_q[rows] + (len(targets) - 1) * self.log1m_p[rows]
        log_inclusion = torch.log(-torch.expm1(log_not_drawn)).float()  # log(1 - P(never drawn))
        return candidates, log_inclusion, inverse[: len(targets)]


def sampled_cross_entropy(logits: torch.Tensor, log_inclusion: torch.Tensor, target_columns: torch.Tensor,
                          reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over the candidates' logits (M, C) with the log-Q correction: every column but the row's
    own target lowered by its log inclusion probability (NegativeSampler)."""
    logits = logits.float()
    corrected = logits - log_inclusion.float()
    rows = torch.arange(len(target_columns), device=logits.device)
    corrected[rows, target_columns] = logits[rows, target_columns]  # a row's own target is always scored: pi = 1
    return F.cross_entropy(corrected, target_columns, reduction=reduction)


def sampled_item_loss(model, head_states: torch.Tensor, targets: torch.Tensor, inputs: torch.Tensor,
                      predict: torch.Tensor, sampler: NegativeSampler, context: dict | None = None) -> torch.Tensor:
    """The sampled softmax's loss: the output layer (and, for the `_attrs` models, the attribute vectors; the
    outfit offsets) computed for the candidates only; on the CPU, fused (LinearCrossEntropy)."""
    candidates, log_inclusion, target_columns = sampler.draw(targets)
    weight, bias = model.output_layer(candidates)
    offsets = model.outfit_offsets(inputs, predict, candidates, context)
    if fused_loss_applies(head_states):
        return LinearCrossEntropy.apply(head_states, weight, bias, target_columns, 0, LOSS_CHUNK_ROWS,
                                        -log_inclusion, offsets)
    logits = F.linear(head_states, weight.to(head_states.dtype), bias.to(head_states.dtype))
    if offsets is not None:
        logits = logits + offsets.to(logits.dtype)
    return sampled_cross_entropy(logits, log_inclusion, target_columns)


def masked_item_loss(
    model: ContextualBert, inputs: torch.Tensor, context: dict, predict: torch.Tensor, items: torch.Tensor,
    sampler: NegativeSampler | None = None, bag_weight: float = 0.0,
) -> torch.Tensor:
    """Cross-entropy over the real articles at the positions to predict: the full softmax, or with a
    `sampler` (train.softmax: sampled) the sampled one, in training (with gradients) only. `bag_weight`: the
    warm-up's share of the bag state in the head states (`bag_warmup_weight`)."""
    head_states = model.head_states(inputs, context, predict, bag_weight)
    targets = items[predict]
    if len(targets) == 0:  # a batch of unknown articles only: nothing to learn from
        return head_states.sum() * 0.0
    if sampler is not None and torch.is_grad_enabled():
        return sampled_item_loss(model, head_states, targets, inputs, predict, sampler, context)
    offsets = model.outfit_offsets(inputs, predict, context=context)  # from what the model sees, not the answers
    if fused_loss_applies(head_states):
        weight, bias = model.output_layer()  # specials included
        return LinearCrossEntropy.apply(head_states, weight, bias, targets, N_SPECIAL, LOSS_CHUNK_ROWS, None, offsets)
    return F.cross_entropy(model.article_logits(head_states, offsets).float(), targets - N_SPECIAL)


# --- the loop -------------------------------------------------------------------------------------------


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """Fused AdamW; weight decay on matrices and embeddings only, not on biases and LayerNorm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, fused=True)  # one kernel; 3-4x faster on the CPU


def train_step(model, optimizer, scheduler, items, context, cfg: TrainConfig, generator, sampler=None,
               bag_weight: float = 0.0):
    """One optimisation step on a batch of outfits; returns the loss and the positions predicted. `sampler`:
    the sampled softmax's (`negative_sampler`), None for the full softmax; `bag_weight`: `bag_warmup_weight`."""
    inputs, predict = mask_items(items, model.n_items, cfg, generator)
    with autocast(items.device):
        loss = masked_item_loss(model, inputs, context, predict, items, sampler, bag_weight)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
    optimizer.step()
    scheduler.step()
    return loss.detach(), predict


def reads_bag_warmup(cfg: TrainConfig, model) -> bool:
    """Does train.bag_warmup_epochs apply to `model`? The paper's encoders only, and not one whose bag path is
    already on (model.bag_path)."""
    return cfg.bag_warmup_epochs > 0 and hasattr(model, "bag_state") and model.model_cfg.bag_path != "output"


def bag_warmup_weight(cfg: TrainConfig, model, epoch: int, start: int | None = 1) -> float:
    """The bag state's weight in epoch `epoch` (1-based) of train.bag_warmup_epochs = N starting at epoch
    `start`: 1 - (epoch - start) / N, then 0; 0 before `start`, and throughout when `start` is None (the
    stuck check, train.bag_warmup_check_steps, has not asked for it)."""
    if start is None or epoch < start or not reads_bag_warmup(cfg, model):
        return 0.0
    return max(0.0, 1.0 - (epoch - start) / cfg.bag_warmup_epochs)


def bag_warmup_plan(cfg: TrainConfig, model) -> dict | None:
    """A run's warm-up before any check: {"from": first epoch or None}; None while the stuck check is due."""
    if not reads_bag_warmup(cfg, model):
        return {"from": None}
    return {"from": 1} if cfg.bag_warmup_check_steps is None else None


def stuck_check(model, val_data: EncodedOutfits, batch_size: int, device, epoch: int) -> dict:
    """train.bag_warmup_check_steps: the outfit dependence on validation at the end of `epoch`; under
    ranking.STUCK_BELOW the encoder predicts without reading the outfit, and the warm-up starts next epoch.
    Draws nothing from the training's random streams (the pairing of outfits has its own seed)."""
    from contextual_bert.ranking import STUCK_BELOW, case_ranks, outfit_dependence

    cases = case_ranks(model, val_data, batch_size, device, with_ranks=False, dependence=True)
    dependence = outfit_dependence(cases["log_prob"], cases["log_prob_shuffled"])
    stuck = dependence is not None and dependence < STUCK_BELOW
    return {"checked_at_epoch": epoch, "outfit_dependence": dependence, "from": epoch + 1 if stuck else None}


def drop_history(history: torch.Tensor, rate: float, generator: torch.Generator) -> torch.Tensor:
    """train.history_dropout: each history article of the batch left out (PAD) with probability `rate`."""
    keep = torch.rand(history.shape, generator=generator, device=history.device) >= rate
    return torch.where(keep, history, torch.full_like(history, PAD_INDEX))


def negative_sampler(cfg: TrainConfig, model, train_data: EncodedOutfits,
                     generator: torch.Generator) -> NegativeSampler | None:
    """The sampled softmax's sampler for train.softmax: sampled (drawing from the training's generator), else None."""
    if cfg.softmax == "full":
        return None
    return NegativeSampler.for_training(train_data.items, model.n_items, cfg.negatives, generator)


def length_batches(
    order: torch.Tensor, lengths: torch.Tensor, batch_size: int, generator: torch.Generator
) -> list[torch.Tensor]:
    """Split a shuffled `order` into batches of outfits of similar length, in random batch order.

    Outfits hold 4-8 items and are padded to the longest: in a random batch of 64 nearly always to 8,
    while the mean is ~5.4, so a third of every step's matrix work would go to padding. Within windows of
    BUCKET_BATCHES batches of `order`, outfits are sorted by length (stable) before batching, and the
    batches are then shuffled: each batch is trimmed to its own longest outfit, and the windows keep the
    batches' contents random. The number of batches is that of plain batching.
    """
    window = batch_size * BUCKET_BATCHES
    batches = []
    for start in range(0, len(order), window):
        chunk = order[start : start + window]
        chunk = chunk[torch.sort(lengths[chunk], stable=True).indices]
        batches += list(chunk.split(batch_size))
    shuffled = torch.randperm(len(batches), generator=generator, device=generator.device).tolist()
    return [batches[i] for i in shuffled]


def lr_factor(cfg: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """The learning rate's multiplier at optimizer step `step` (0-based): linear warm-up over
    cfg.warmup_steps, then cfg.schedule ("cosine", "linear" or "constant") from 1 down to
    cfg.min_lr_fraction at total_steps (and held there)."""
    warmup, floor = cfg.warmup_steps, cfg.min_lr_fraction

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1.0 - progress
        return floor + (1.0 - floor) * decay

    return factor


def convergence(history: list[dict], stopped_early: bool) -> str | None:
    """How a run converged: "early_stopping", "plateau" (its last CONVERGENCE_EPOCHS epochs improved the
    best validation cross-entropy by less than CONVERGENCE_NATS together), or None (still improving)."""
    if stopped_early:
        return "early_stopping"
    values = [row["val_cross_entropy"] for row in history]
    if len(values) <= CONVERGENCE_EPOCHS:
        return None
    gained = min(values[:-CONVERGENCE_EPOCHS]) - min(values)
    return "plateau" if gained < CONVERGENCE_NATS else None


def validation_cross_entropy(model: ContextualBert, data: EncodedOutfits, batch_size: int, device) -> float:
    """Mean cross-entropy with every item of every outfit masked in turn (the evaluation's cases)."""
    from contextual_bert.ranking import case_ranks

    cases = case_ranks(model, data, batch_size, device, with_ranks=False)
    return float(-cases["log_prob"].mean()) if len(cases["log_prob"]) else float("nan")


def train_sample(train_data: EncodedOutfits, n: int) -> EncodedOutfits:
    """A fixed sample of n training outfits, evenly spaced (the split's order is already a hash order)."""
    n = min(n, len(train_data))
    return train_data.subset(torch.linspace(0, len(train_data) - 1, n).round().long().unique())


def _data_fingerprint(data: EncodedOutfits) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in [("items", data.items), *sorted(data.context.items())]:
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def code_digest() -> str:
    """SHA-256 of the library's source files. Part of the run key: DVC re-runs a training when code it runs
    changed, and a finished last.pt of the old code must not then pass for the new run."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def run_key(model: ContextualBert, train_cfg: TrainConfig, seed: int, train_data, val_data, device) -> dict:
    """What must match for last.pt to be resumed; anything else starts the run afresh."""
    train_settings = train_cfg.read_by(model.variant, exclude=set(RESUMABLE_CHANGES))
    return {
        "code": code_digest(),
        "device": torch.device(device).type,
        "model_config": model.model_cfg.model_dump(),
        "variant": model.variant,
        "n_items": model.n_items,
        "spec": model.spec.to_json(),
        "train": train_settings,
        "seed": seed,
        "train_data": _data_fingerprint(train_data),
        "val_data": _data_fingerprint(val_data),
    }


# --- determinism and exact resume ----------------------------------------------------------------------


def pin_threads_and_algorithms(train_cfg: TrainConfig) -> None:
    """Compute with train.num_threads threads (a recorded setting, never the machine's default) and torch's
    deterministic algorithms (docs/reproducibility.md: what they cost)."""
    torch.set_num_threads(train_cfg.num_threads)
    # cuBLAS is deterministic only with a fixed workspace, set before its first call (harmless on the CPU)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


def seeded_random_states(seed: int, device: torch.device) -> torch.Generator:
    """Seed every random stream from the run's seed; returns the run's own generator (shuffling, masking).
    torch's global generator draws dropout; numpy's and Python's are seeded too, though the loop draws from
    neither, so that nothing a step might call depends on the process."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    return generator


def random_states(generator: torch.Generator, device: torch.device) -> dict:
    """Every random stream a step may draw from: the run's generator (shuffling, masking), torch's global one
    (dropout, id dropout), CUDA's, numpy's and Python's (the loop draws from neither; saved so that code which
    does cannot break an exact resume). Tensors and plain values only: last.pt loads with weights_only."""
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "generator": generator.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached_gaussian)},
        "python": random.getstate(),
    }


def restore_random_states(states: dict, generator: torch.Generator, device: torch.device) -> None:
    generator.set_state(states["generator"])
    torch.set_rng_state(states["torch"])
    if device.type == "cuda" and states["cuda"] is not None:
        torch.cuda.set_rng_state(states["cuda"], device)
    numpy = states["numpy"]
    np.random.set_state(("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["cached_gaussian"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


def save_resume_state(path: Path, key: dict, model, optimizer, scheduler, generator, device, state: dict,
                      position: dict | None = None) -> None:
    """last.pt: all a run needs to go on exactly. `position` is None at an epoch's end; within an epoch it
    holds the epoch, the steps done, the generator's state at the epoch's start and the loss summed so far."""
    atomic_save(
        {
            "run_key": key,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "random": random_states(generator, device),
            "state": state,
            "position": position,
        },
        path,
    )


def load_resume_state(path: Path, key: dict, model, optimizer, scheduler, generator, device):
    """Restore last.pt when it belongs to the run `key`: returns (state, position, random states), the last two
    for a run stopped within an epoch (else None). Returns None and removes the run's files when last.pt is
    another run's (other settings or data): the run starts afresh."""
    if not path.exists():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if saved.get("run_key") != key or "random" not in saved:  # another run's, or written before exact resume
        for stale in ("last.pt", "checkpoint.pt", "history.json", "metrics.json"):
            (path.parent / stale).unlink(missing_ok=True)
        return None
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    restore_random_states(saved["random"], generator, device)
    return saved["state"], saved["position"], saved["random"]


def _write_json(path: Path, obj) -> None:
    atomic_save(json.dumps(obj, indent=2), path, write=lambda text, tmp: Path(tmp).write_text(text))


ID_DROPOUT_FLOOR = 0.05  # "auto"'s least rate: [UNK] is trained as input and target (articles added after training)


def id_dropout_rate(setting: float | str, model: ContextualBert, val_data: EncodedOutfits) -> float:
    """The id dropout an "_attrs" model trains with: `setting` (variants.<model>_attrs.id_dropout), or for "auto"
    the share of the validation outfits' articles that have no id embedding (catalogue index >= n_ids: unseen in
    training), at least ID_DROPOUT_FLOOR. Why: id dropout is there so that training meets [UNK] + attributes as
    evaluation does; where it meets none, dropping ids only hides what the ids carry (on planted data with
    hidden tastes, everything the attributes do not say; docs/encoder_recipe.md)."""
    if setting != "auto":
        return float(setting)
    real = val_data.items >= N_SPECIAL
    unseen = real & (val_data.items >= model.n_ids)
    return max(ID_DROPOUT_FLOOR, int(unseen.sum()) / max(1, int(real.sum())))


def fit(
    model: ContextualBert,
    train_data: EncodedOutfits,
    val_data: EncodedOutfits,
    train_cfg: TrainConfig,
    out_dir: Path,
    seed: int,
    on_epoch_end: EpochHook | None = None,
) -> dict:
    """Train `model` in place; resume from out_dir/last.pt when it belongs to the same run.

    Writes out_dir/checkpoint.pt (best validation cross-entropy), last.pt (resume state, every epoch),
    history.json (one row per epoch) and metrics.json, which is also returned. A run that has already
    stopped (at max_epochs, or early under the current patience) is not trained further; a larger patience
    continues a run that stopped early, as if it had had that patience from the start; a new max_epochs (the
    decay's horizon) starts it afresh.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if len(train_data) == 0 or len(val_data) == 0:
        raise ContextualBertError(f"{out_dir}: the train and validation splits must not be empty")
    device = select_device(train_cfg.device)
    pin_threads_and_algorithms(train_cfg)
    if device.type == "cpu":
        keep_freed_memory()

    key = run_key(model, train_cfg, seed, train_data, val_data, device)
    id_dropout = None
    if uses_attributes(model.variant):  # read by "_attrs" models only: the paper's models train as before
        id_dropout = id_dropout_rate(train_cfg.id_dropout, model, val_data)
        model.set_id_dropout(id_dropout)
    model.to(device)
    train_data, val_data = train_data.to(device), val_data.to(device)
    optimizer = make_optimizer(model, train_cfg, device)
    n_train = len(train_data)
    steps_per_epoch = math.ceil(n_train / train_cfg.batch_size)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_factor(train_cfg, steps_per_epoch * train_cfg.max_epochs)
    )
    train_probe = train_sample(train_data, len(val_data))
    train_lengths = (train_data.items != PAD_INDEX).sum(dim=1)
    generator = seeded_random_states(seed, device)
    sampler = negative_sampler(train_cfg, model, train_data, generator)  # draws from the generator: resumable
    state = {"epoch": 0, "history": [], "best_val": math.inf, "best_epoch": 0, "bad_epochs": 0,
             "stopped": False, "seconds": 0.0, "bag_warmup": bag_warmup_plan(train_cfg, model)}  # fmt: skip

    last_path = out_dir / "last.pt"
    resumed = load_resume_state(last_path, key, model, optimizer, scheduler, generator, device)
    position = mid_epoch_random = None
    if resumed is not None:
        state, position, mid_epoch_random = resumed
        # patience may differ: it only decides when a run stops, so a run the old patience stopped goes
        # on under a larger one, exactly as if it had had that patience from the start
        state["stopped"] = state["bad_epochs"] >= train_cfg.patience

    n_params = count_paper_parameters(model)
    for epoch in range(state["epoch"] + 1, train_cfg.max_epochs + 1):
        if state["stopped"]:
            break
        started = saved_at = time.perf_counter()
        model.train()
        if position is not None:  # resumed within this epoch: its batches from the generator's state at its start
            generator.set_state(position["epoch_generator"])
        epoch_generator = generator.get_state()
        order = torch.randperm(n_train, generator=generator, device=device)
        batches = length_batches(order, train_lengths, train_cfg.batch_size, generator)
        widths = torch.stack([train_lengths[index].max() for index in batches]).tolist()  # one device sync
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        n_targets, first_step = 0, 0
        if position is not None:  # then every stream where it was, and the steps done skipped
            first_step = position["step"]
            loss_sum, n_targets = position["loss_sum"].to(device), position["n_targets"]
            started -= position["seconds"]
            restore_random_states(mid_epoch_random, generator, device)
            position = None
        bag_weight = bag_warmup_weight(train_cfg, model, epoch, (state["bag_warmup"] or {}).get("from"))
        bar = tqdm(total=n_train, desc=f"{model.variant} epoch {epoch}", unit="outfit", leave=False,
                   mininterval=1.0, dynamic_ncols=True)  # fmt: skip
        for step, (index, width) in enumerate(zip(batches, widths)):
            if step < first_step:
                continue
            items = train_data.items[index, :width]  # right-padded: the batch without its padding columns
            context = {name: values[index] for name, values in train_data.context.items()}
            if train_cfg.history_dropout > 0 and HISTORY_FEATURE in context:
                context[HISTORY_FEATURE] = drop_history(context[HISTORY_FEATURE], train_cfg.history_dropout, generator)
            learning_rate = scheduler.get_last_lr()[0]  # the rate this step uses
            loss, predict = train_step(model, optimizer, scheduler, items, context, train_cfg, generator, sampler,
                                       bag_weight)
            count = int(predict.sum()) if device.type == "cpu" else predict.sum()
            loss_sum += loss.detach().double() * count
            n_targets += count
            bar.update(len(index))
            if step % 20 == 0 or step == steps_per_epoch - 1:
                elapsed = time.perf_counter() - started
                bar.set_postfix(loss=f"{float(loss):.3f}", samples_per_s=f"{bar.n / max(elapsed, 1e-9):.0f}")
            if (train_cfg.checkpoint_every_s > 0 and step + 1 < len(batches)
                    and time.perf_counter() - saved_at >= train_cfg.checkpoint_every_s):
                save_resume_state(last_path, key, model, optimizer, scheduler, generator, device, state, {
                    "epoch": epoch, "step": step + 1, "epoch_generator": epoch_generator,
                    "loss_sum": loss_sum.cpu(), "n_targets": int(n_targets),
                    "seconds": time.perf_counter() - started})  # fmt: skip
                saved_at = time.perf_counter()
        bar.close()
        train_seconds = time.perf_counter() - started

        val_ce = validation_cross_entropy(model, val_data, 4 * train_cfg.batch_size, device)
        if not math.isfinite(val_ce) and not math.isfinite(state["best_val"]):
            # never a result: an infinite or undefined loss cannot choose a checkpoint
            raise ContextualBertError(
                f"{out_dir}: validation cross-entropy is {val_ce} at epoch {epoch}, no checkpoint can be kept; "
                "check the validation split (`contextual-bert features` guards it: features.min_known_targets) "
                "or lower train.learning_rate if the training diverged")
        row = {
            "epoch": epoch,
            "train_loss": float(loss_sum / n_targets),
            "train_cross_entropy": validation_cross_entropy(model, train_probe, 4 * train_cfg.batch_size, device),
            "val_cross_entropy": val_ce,
            "learning_rate": learning_rate,  # at the epoch's last step
            "samples_per_s": n_train / train_seconds,
            "seconds": time.perf_counter() - started,
        }
        if reads_bag_warmup(train_cfg, model):
            row["bag_weight"] = bag_weight
            if state["bag_warmup"] is None and epoch * steps_per_epoch >= train_cfg.bag_warmup_check_steps:
                state["bag_warmup"] = stuck_check(model, val_data, 4 * train_cfg.batch_size, device, epoch)
                row["outfit_dependence"] = state["bag_warmup"]["outfit_dependence"]
        state["history"].append(row)
        state["epoch"] = epoch
        state["seconds"] += row["seconds"]
        if val_ce < state["best_val"]:
            state.update(best_val=val_ce, best_epoch=epoch, bad_epochs=0)
            save_checkpoint(out_dir / "checkpoint.pt", model,
                            {"epoch": epoch, "val_cross_entropy": val_ce, "seed": seed, "parameters": n_params})  # fmt: skip
        else:
            state["bad_epochs"] += 1
            state["stopped"] = state["bad_epochs"] >= train_cfg.patience
        save_resume_state(last_path, key, model, optimizer, scheduler, generator, device, state)
        _write_json(out_dir / "history.json", state["history"])
        if on_epoch_end is not None:
            on_epoch_end(epoch, row)

    if not math.isfinite(state["best_val"]):
        raise ContextualBertError(f"{out_dir}: no epoch had a finite validation cross-entropy; no checkpoint kept")
    metrics = {
        "variant": model.variant,
        "seed": seed,
        "parameters": n_params,
        "epochs": state["epoch"],
        "best_epoch": state["best_epoch"],
        "best_val_cross_entropy": state["best_val"],
        "stopped_early": state["stopped"],
        "converged": convergence(state["history"], state["stopped"]),
        "seconds": state["seconds"],
        "device": device.type,
        "threads": train_cfg.num_threads,
        "cpu_kernels": cpu_kernels.in_effect() if device.type == "cpu" else None,
        **({"bag_warmup": state["bag_warmup"]} if reads_bag_warmup(train_cfg, model) else {}),
        **({"id_dropout": id_dropout} if id_dropout is not None else {}),
    }
    _write_json(out_dir / "metrics.json", metrics)
    return metrics


def train(
    features_dir: Path,
    out_dir: Path,
    variant: str,
    seed: int,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    on_epoch_end: EpochHook | None = None,
) -> dict:
    """Train one (variant, seed) run on the features stage's splits; see `fit`.

    Resumes from out_dir/last.pt when it was written by the same run (same model and train settings, seed
    and data; patience, device and checkpoint_every_s may differ). A run that already finished is not
    re-trained (its metrics are returned again); a run whose settings or data differ starts from scratch.
    """
    from contextual_bert.cooccurrence import init_from_cooccurrence
    from contextual_bert.feature_store import load_article_vocab, load_catalogue, load_spec, load_split

    spec = load_spec(features_dir)
    if base_model(variant) != "none" and not spec.features:
        raise ContextualBertError(
            f"{features_dir}: variant '{variant}' conditions on context, but this data has no context columns "
            "(e.g. curated sets without customers); set train.variants: [none]")
    n_items = len(load_article_vocab(features_dir))
    # "<model>_attrs": the catalogue's articles, known by their attributes (items by catalogue index)
    catalogue = load_catalogue(features_dir) if uses_attributes(variant) else None
    train_data = load_split(features_dir, "train", model_cfg.max_set_size, catalogue=catalogue is not None)
    val_data = load_split(features_dir, "val", model_cfg.max_set_size, catalogue=catalogue is not None)
    torch.manual_seed(seed)
    model = build_model(model_cfg, variant, n_items, spec, None if catalogue is None else catalogue.spec,
                        overlap=catalogue is not None and train_cfg.attribute_overlap)
    if catalogue is not None:
        model.set_catalogue(catalogue.tensors())
    if train_cfg.init_embeddings == "cooccurrence":  # before fit: a resumed run loads its own weights
        init_from_cooccurrence(model, train_data.items)
    return fit(model, train_data, val_data, train_cfg, out_dir, seed, on_epoch_end)
