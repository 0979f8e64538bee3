"""The masked-item objective: which positions are predicted (`mask_items`, BERT's 80/10/10), and the loss over
the real articles at them, the full softmax or the sampled one (`NegativeSampler`, log-Q corrected), fused on
the CPU (`LinearCrossEntropy`: the (M, C) logits are never stored)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from contextual_bert.config import TrainConfig
from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX, EncodedOutfits
from contextual_bert.errors import ContextualBertError


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
    def forward(ctx, h, full_weight, full_bias, targets, first: int, chunk_rows: int, shift=None, full_offsets=None):
        n = h.shape[0]
        weight = full_weight[first:]
        bias = full_bias[first:] if shift is None else full_bias[first:] + shift
        weight_and_bias = torch.cat([weight, bias[:, None]], dim=1)
        h_and_one = F.pad(h, (0, 1), value=1.0)
        grad_h = torch.empty_like(h)
        grad_full_weight, grad_full_bias = torch.zeros_like(full_weight), torch.zeros_like(full_bias)
        grad_weight, grad_bias = grad_full_weight[first:], grad_full_bias[first:]
        offsets: torch.Tensor | None = None
        grad_offsets: torch.Tensor | None = None
        grad_full_offsets: torch.Tensor | None = None
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
            if grad_offsets is not None:  # set with offsets
                torch.mul(exp, inv_sum, out=grad_offsets[rows])
        grad_h.sub_(full_weight[targets], alpha=1.0 / n)
        grad_full_weight.index_add_(0, targets, h, alpha=-1.0 / n)
        grad_full_bias.sub_(torch.bincount(targets, minlength=len(full_bias)).to(full_bias.dtype), alpha=1.0 / n)
        if grad_offsets is not None:
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


def negative_sampler(
    cfg: TrainConfig, model, train_data: EncodedOutfits, generator: torch.Generator
) -> NegativeSampler | None:
    """The sampled softmax's sampler for train.softmax: sampled (drawing from the training's generator), else None."""
    if cfg.softmax == "full":
        return None
    return NegativeSampler.for_training(train_data.items, model.n_items, cfg.negatives, generator)


def sampled_cross_entropy(
    logits: torch.Tensor, log_inclusion: torch.Tensor, target_columns: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy over the candidates' logits (M, C) with the log-Q correction: every column but the row's
    own target lowered by its log inclusion probability (NegativeSampler)."""
    logits = logits.float()
    corrected = logits - log_inclusion.float()
    rows = torch.arange(len(target_columns), device=logits.device)
    corrected[rows, target_columns] = logits[rows, target_columns]  # a row's own target is always scored: pi = 1
    return F.cross_entropy(corrected, target_columns, reduction=reduction)


def sampled_item_loss(
    model,
    head_states: torch.Tensor,
    targets: torch.Tensor,
    inputs: torch.Tensor,
    predict: torch.Tensor,
    sampler: NegativeSampler,
    context: dict | None = None,
) -> torch.Tensor:
    """The sampled softmax's loss: the output layer (and, for the `_attrs` models, the attribute vectors; the
    outfit offsets) computed for the candidates only; on the CPU, fused (LinearCrossEntropy)."""
    candidates, log_inclusion, target_columns = sampler.draw(targets)
    weight, bias = model.output_layer(candidates)
    offsets = model.outfit_offsets(inputs, predict, candidates, context)
    if fused_loss_applies(head_states):
        return LinearCrossEntropy.apply(
            head_states, weight, bias, target_columns, 0, LOSS_CHUNK_ROWS, -log_inclusion, offsets
        )
    logits = F.linear(head_states, weight.to(head_states.dtype), bias.to(head_states.dtype))
    if offsets is not None:
        logits = logits + offsets.to(logits.dtype)
    return sampled_cross_entropy(logits, log_inclusion, target_columns)


def masked_item_loss(
    model,
    inputs: torch.Tensor,
    context: dict,
    predict: torch.Tensor,
    items: torch.Tensor,
    sampler: NegativeSampler | None = None,
) -> torch.Tensor:
    """Cross-entropy over the real articles at the positions to predict: the full softmax, or with a
    `sampler` (train.softmax: sampled) the sampled one, in training (with gradients) only."""
    head_states = model.head_states(inputs, context, predict)
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
