"""Ranking every case of a split: the one scorer that training (its validation loss), evaluation and
promotion share. A case is (outfit, position): the item there is masked and its target ranked against every
real article, the outfit's other items excluded (evaluation.py's docstring has the protocol).

Nothing here reads files or computes intervals, so training's deps stop at the model and the features.
"""

from __future__ import annotations

import numpy as np
import torch

from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX, EncodedOutfits

DEPENDENCE_SEED = 0  # the pairing of each test outfit with another of its length (outfit dependence)
# The outfit dependence (nats) below which a trained model predicts without its encoder reading the outfit's
# articles (a popularity table, with the attribute rule for the "_attrs" models), whatever its loss: Table 1's
# **stuck**, and training's check before the warm-up from the bag (train.bag_warmup_check_steps)
STUCK_BELOW = 0.02


def donor_outfits(items: torch.Tensor, seed: int = DEPENDENCE_SEED) -> torch.Tensor:
    """(B,) for every outfit of `items` (B, L) another outfit of the same length, a random cyclic pairing within
    each length (an outfit alone of its length is its own donor)."""
    lengths = (items != PAD_INDEX).sum(dim=1).cpu().numpy()
    rng = np.random.default_rng(seed)
    donor = np.arange(len(lengths))
    for n in np.unique(lengths):
        rows = rng.permutation(np.flatnonzero(lengths == n))
        donor[rows] = np.roll(rows, 1)
    return torch.from_numpy(donor).to(items.device)


def _shuffled_logits(model, masked: torch.Tensor, donor_masked: torch.Tensor, context: dict) -> torch.Tensor:
    """The logits of `model` when its encoder reads `donor_masked` (another outfit, [MASK] at the same place),
    with the attribute-overlap offsets (if any) of the real outfit `masked`."""
    logits = model.masked_logits(donor_masked, context).float()
    real = model.outfit_offsets(masked, masked == MASK_INDEX)
    if real is not None:
        logits = logits - model.outfit_offsets(donor_masked, donor_masked == MASK_INDEX).float() + real.float()
    return logits


def outfit_dependence(log_prob, log_prob_shuffled) -> float | None:
    """The cross-entropy with the encoder reading other outfits minus the real one (nats; evaluation.py)."""
    if len(log_prob) == 0:
        return None
    return float(np.mean(np.asarray(log_prob, dtype=np.float64) - np.asarray(log_prob_shuffled, dtype=np.float64)))


def measures_dependence(model) -> bool:
    """Trained models (an encoder and the output side of model.ArticleScores) get the outfit dependence."""
    return hasattr(model, "outfit_offsets") and hasattr(model, "head")


def case_ranks(model, data: EncodedOutfits, batch_size: int, device, with_ranks: bool = True,
               dependence: bool = False) -> dict:
    """Rank and log-probability of the target of every case (every non-padding item of every outfit).

    `model` is anything with `masked_logits(items, context) -> (B, n_items)` (a ContextualBert or the
    PopularityModel). Returns numpy arrays, one entry per rankable case, in outfit order: "outfit" (row of
    `data`), "position", "target" (article index), "rank" (1 = best; absent if not with_ranks), "log_prob";
    and "n_unknown_targets", the skipped cases whose target is [UNK]. With `dependence`, also
    "log_prob_shuffled": the target's log-probability when the encoder reads another outfit's articles
    (`_shuffled_logits`, the outfits paired by `donor_outfits`).
    """
    device = torch.device(device)
    model.eval()
    items = data.items.to(device)
    context = {name: values.to(device) for name, values in data.context.items()}
    outfit, position = (items != PAD_INDEX).nonzero(as_tuple=True)
    target = items[outfit, position]
    known = target != UNKNOWN_INDEX
    n_unknown = int((~known).sum())
    outfit, position, target = outfit[known], position[known], target[known]

    # Cases in order of outfit length, so that each batch is trimmed to little padding (items are
    # right-padded); the results are put back in outfit order below.
    lengths = (items != PAD_INDEX).sum(dim=1)
    by_length = torch.sort(lengths[outfit], stable=True).indices
    ranks, log_probs, shuffled = [], [], []
    donor = donor_outfits(items) if dependence else None
    article_index = torch.arange(getattr(model, "n_items"), device=device)
    with torch.no_grad():  # fp32 on every device: bf16 logits tie, and ties would be broken by article index
        for start in range(0, len(target), batch_size):
            rows = by_length[start : start + batch_size]
            o, p, t = outfit[rows], position[rows], target[rows, None]
            masked = items[o, : int(lengths[o].max())].clone()
            masked[torch.arange(len(o), device=device), p] = MASK_INDEX
            case_context = {name: values[o] for name, values in context.items()}
            logits = model.masked_logits(masked, case_context).float()
            logits[:, :N_SPECIAL] = float("-inf")  # never ranked, whatever the scorer says
            target_logit = logits.gather(1, t)
            log_probs.append(target_logit - torch.logsumexp(logits[:, N_SPECIAL:], dim=1, keepdim=True))
            if donor is not None:
                donor_masked = items[donor[o], : masked.shape[1]].clone()
                donor_masked[torch.arange(len(o), device=device), p] = MASK_INDEX
                other = _shuffled_logits(model, masked, donor_masked, case_context)[:, N_SPECIAL:]
                shuffled.append(other.gather(1, t - N_SPECIAL) - torch.logsumexp(other, dim=1, keepdim=True))
            if with_ranks:
                scores = logits.scatter(1, masked, float("-inf"))  # the outfit's other items are not ranked
                ahead = (scores > target_logit) | ((scores == target_logit) & (article_index < t))
                ranks.append(1 + ahead.sum(dim=1))

    def in_outfit_order(chunks: list[torch.Tensor]) -> torch.Tensor:
        values = torch.cat(chunks).reshape(-1)
        restored = torch.empty_like(values)
        restored[by_length] = values
        return restored

    result = {
        "outfit": outfit.cpu().numpy(),
        "position": position.cpu().numpy(),
        "target": target.cpu().numpy(),
        "log_prob": in_outfit_order(log_probs).double().cpu().numpy() if log_probs else np.zeros(0),
        "n_unknown_targets": np.int64(n_unknown),
    }
    if donor is not None:
        result["log_prob_shuffled"] = (in_outfit_order(shuffled).double().cpu().numpy() if shuffled
                                       else np.zeros(0))
    if with_ranks:
        result["rank"] = in_outfit_order(ranks).cpu().numpy() if ranks else np.zeros(0, dtype=np.int64)
    return result
