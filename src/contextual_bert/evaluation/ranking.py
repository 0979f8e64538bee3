"""Ranking every case of a split: the one scorer that training (its validation loss), evaluation and
promotion share. A case is (outfit, position): the item there is masked and its target ranked against every
real article, the outfit's other items excluded (evaluation.py's docstring has the protocol).

Nothing here reads files or computes intervals, so training's deps stop at the model and the features.

A pass over a split scores the whole catalogue once per batch of cases. What does not change from batch to
batch is built once per pass (`scoring_pass`: the output layer, which for the "_attrs" models is every
catalogue article's vector; model.ArticleHead.catalogue_pass), and the outfit dependence's shuffled pass
shares the real pass's outfit offsets and takes only the target's log-probability (`_shuffled_log_probs`; for
the "_attrs" models a block of articles at a time, as the real pass of the stuck check, which needs no ranks).
A count model with a closed form (`ranked_cases`) is not scored per case at all: its ranks come from the order
of its few score vectors (`ScoreOrder`). A pass of many cases shows a progress bar.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX, EncodedOutfits

DEPENDENCE_SEED = 0  # the pairing of each test outfit with another of its length (outfit dependence)
# The outfit dependence (nats) below which a trained model predicts without its encoder reading the outfit's
# articles (a popularity table, with the attribute rule for the "_attrs" models), whatever its loss: Table 1's
# **stuck**, and training's check before the warm-up from the bag (train.bag_warmup_check_steps)
STUCK_BELOW = 0.02
PROGRESS_MIN_CASES = 2_000  # a pass over fewer cases shows no progress bar (seconds at most)
CLOSED_FORM_CASES = 4_096  # cases a count model ranks at a time without scoring the catalogue


def is_ahead(scores, index, target_score, target):
    """Which articles rank ahead of the target: a higher score, or the same score and a lower index (the tie
    rule of evaluation.py). Broadcasts."""
    return (scores > target_score) | ((scores == target_score) & (index < target))


def distinct_real(items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`items` (C, L) sorted along each row, and which of them are the first of a real article: each row's
    distinct real articles (no padding, no special index)."""
    ordered = items.sort(dim=1).values
    return ordered, (ordered >= N_SPECIAL) & F.pad(ordered[:, 1:] != ordered[:, :-1], (1, 0), value=True)


def others_ahead(others: torch.Tensor, score_of, target_score, target) -> torch.Tensor:
    """(C,) how many of the outfit's other articles `others` (C, L; any padding, repeats counted once) rank
    ahead of the target, their scores `score_of(items)` (C, L): what a rank without them takes off."""
    ordered, first = distinct_real(others)
    return (first & is_ahead(score_of(ordered), ordered, target_score[:, None], target[:, None])).sum(dim=1)


class ScoreOrder:
    """The articles of one score vector in rank order (score descending, ties by index), to count how many
    rank ahead of any (score, index) by binary search: a count model's ranks without scoring the catalogue
    for every case."""

    def __init__(self, scores: torch.Tensor):
        sorted_ = torch.sort(-scores.float(), stable=True)  # ascending negated scores; ties keep index order
        self.neg, self.n = sorted_.values, len(scores)
        self.block = torch.cumsum(F.pad(self.neg[1:] != self.neg[:-1], (1, 0)).long(), 0)  # tie block
        self.key = self.block * self.n + sorted_.indices  # increasing along the order

    def count_ahead(self, score: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """(C,) how many articles rank ahead of one of score `score` and index `index` (C,)."""
        neg = (-score.float()).contiguous()
        above = torch.searchsorted(self.neg, neg, side="left")
        tied = torch.searchsorted(self.neg, neg, side="right") > above
        block = self.block[above.clamp_max(self.n - 1)]
        before = torch.searchsorted(self.key, block * self.n + index, side="left") - above
        return above + torch.where(tied, before, 0)


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


def _in_blocks(model, device: torch.device) -> bool:
    """Does `model` take a target's log-probability a block of articles at a time (`target_log_probs`)? The
    "_attrs" models on the CPU; the models of ids keep the whole logits and their bits (Table 1's rows)."""
    return (
        getattr(model, "attributes", None) is not None and hasattr(model, "target_log_probs") and device.type == "cpu"
    )


def _shuffled_log_probs(
    model, donor_masked: torch.Tensor, context: dict, real_offsets, target: torch.Tensor
) -> torch.Tensor:
    """(B, 1) the log-probability of `target` (B, 1) over the real articles when the encoder of `model` reads
    `donor_masked` (another outfit, [MASK] at the same place), with the logit offsets of the real outfit,
    `real_offsets` (its `outfit_offsets`, shared with the real pass; None: the model has none): the attribute
    overlap's of the real outfit, and the customer's history's.

    Taken a block of articles at a time where `_in_blocks`, else from masked_logits, as before. (Before,
    masked_logits added the donor's overlap offsets, which were then taken out again and the real ones added,
    and the log-sum-exp was over the whole logits: the same numbers up to the order of the sums, within 1e-7
    nats of the dependence measured.)"""
    if _in_blocks(model, donor_masked.device):
        return model.target_log_probs(donor_masked, context, target, real_offsets)
    other = model.masked_logits(donor_masked, context, offsets=real_offsets).float()[:, N_SPECIAL:]
    return other.gather(1, target - N_SPECIAL) - torch.logsumexp(other, dim=1, keepdim=True)


def scoring_pass(model):
    """A context for a pass of `model` over many batches: the model's `catalogue_pass` (its output layer built
    once, model.ArticleHead), or nothing for a scorer without one (the counts)."""
    catalogue_pass = getattr(model, "catalogue_pass", None)
    return catalogue_pass() if catalogue_pass is not None else nullcontext()


def progress(total: int, desc: str, unit: str):
    """The bar of a long pass (as training's epochs): off for fewer than PROGRESS_MIN_CASES."""
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        leave=False,
        mininterval=1.0,
        dynamic_ncols=True,
        disable=total < PROGRESS_MIN_CASES,
    )


def scorer_name(model) -> str:
    return getattr(model, "name", None) or type(model).__name__  # a progress bar's label


def outfit_dependence(log_prob, log_prob_shuffled) -> float | None:
    """The cross-entropy with the encoder reading other outfits minus the real one (nats; evaluation.py)."""
    if len(log_prob) == 0:
        return None
    return float(np.mean(np.asarray(log_prob, dtype=np.float64) - np.asarray(log_prob_shuffled, dtype=np.float64)))


def measures_dependence(model) -> bool:
    """Trained models (an encoder and the article head of model.ArticleHead) get the outfit dependence."""
    return hasattr(model, "outfit_offsets") and hasattr(model, "head")


def case_ranks(
    model,
    data: EncodedOutfits,
    batch_size: int,
    device,
    with_ranks: bool = True,
    dependence: bool = False,
    mass_from: int | None = None,
) -> dict:
    """Rank and log-probability of the target of every case (every non-padding item of every outfit).

    `model` is anything with `masked_logits(items, context) -> (B, n_items)` (a ContextualBert or the
    PopularityModel). Returns numpy arrays, one entry per rankable case, in outfit order: "outfit" (row of
    `data`), "position", "target" (article index), "rank" (1 = best; absent if not with_ranks), "log_prob";
    and "n_unknown_targets", the skipped cases whose target is [UNK]. With `dependence`, also
    "log_prob_shuffled": the target's log-probability when the encoder reads another outfit's articles
    (`_shuffled_log_probs`, the outfits paired by `donor_outfits`; the model's `masked_logits` then takes
    `offsets`, and it has `outfit_offsets`). With `mass_from`, also "mass": the softmax mass of the catalogue
    rows >= mass_from (e.g. the articles without an id, from `model.n_ids`).
    """
    if mass_from is not None and dependence:
        raise ValueError("case_ranks: mass_from is computed on the real pass only (dependence=False)")
    device = torch.device(device)
    model.eval()
    items = data.items.to(device)
    context = {name: values.to(device) for name, values in data.context.items()}
    outfit, position = (items != PAD_INDEX).nonzero(as_tuple=True)
    target = items[outfit, position]
    known = target != UNKNOWN_INDEX
    n_unknown = int((~known).sum())
    outfit, position, target = outfit[known], position[known], target[known]

    if getattr(model, "ranked_cases", None) is not None and not dependence and mass_from is None:
        return _count_model_cases(model, items, context, outfit, position, target, n_unknown, with_ranks)

    # Cases in order of outfit length, so that each batch is trimmed to little padding (items are
    # right-padded); the results are put back in outfit order below.
    lengths = (items != PAD_INDEX).sum(dim=1)
    by_length = torch.sort(lengths[outfit], stable=True).indices
    ranks, log_probs, shuffled, masses = [], [], [], []
    donor = donor_outfits(items) if dependence else None
    article_index = torch.arange(model.n_items, device=device)
    bar = progress(len(target), f"{scorer_name(model)} {'dependence' if dependence else 'ranking'}", "case")
    # fp32 on every device: bf16 logits tie, and ties would be broken by article index
    with torch.no_grad(), scoring_pass(model), bar:
        for start in range(0, len(target), batch_size):
            rows = by_length[start : start + batch_size]
            o, p, t = outfit[rows], position[rows], target[rows, None]
            masked = items[o, : int(lengths[o].max())].clone()
            masked[torch.arange(len(o), device=device), p] = MASK_INDEX
            case_context = {name: values[o] for name, values in context.items()}
            if donor is not None:  # the real outfit's offsets, once for both passes
                offsets = model.outfit_offsets(masked, masked == MASK_INDEX, context=case_context, blocks=True)
            if donor is not None and not with_ranks and _in_blocks(model, device):
                # the stuck check: log-probabilities only, the real pass taken in blocks as the shuffled one
                log_probs.append(model.target_log_probs(masked, case_context, t, offsets))
            else:
                if donor is not None:
                    logits = model.masked_logits(masked, case_context, offsets=offsets).float()
                else:
                    logits = model.masked_logits(masked, case_context).float()
                logits[:, :N_SPECIAL] = float("-inf")  # never ranked, whatever the scorer says
                target_logit = logits.gather(1, t)
                total = torch.logsumexp(logits[:, N_SPECIAL:], dim=1, keepdim=True)
                log_probs.append(target_logit - total)
                if mass_from is not None:
                    masses.append(torch.exp(torch.logsumexp(logits[:, mass_from:], dim=1, keepdim=True) - total))
            if donor is not None:
                donor_masked = items[donor[o], : masked.shape[1]].clone()
                donor_masked[torch.arange(len(o), device=device), p] = MASK_INDEX
                shuffled.append(_shuffled_log_probs(model, donor_masked, case_context, offsets, t))
                del offsets
            if with_ranks:
                scores = logits.scatter(1, masked, float("-inf"))  # the outfit's other items are not ranked
                ranks.append(1 + is_ahead(scores, article_index, target_logit, t).sum(dim=1))
            bar.update(len(rows))

    def in_outfit_order(chunks: list[torch.Tensor]) -> torch.Tensor:
        values = torch.cat(chunks).reshape(-1)
        restored = torch.empty_like(values)
        restored[by_length] = values
        return restored

    result = _cases(
        outfit,
        position,
        target,
        n_unknown,
        in_outfit_order(log_probs) if log_probs else None,
        (in_outfit_order(ranks) if ranks else None) if with_ranks else False,
        (in_outfit_order(shuffled) if shuffled else None) if donor is not None else False,
    )
    if mass_from is not None:
        result["mass"] = in_outfit_order(masses).double().cpu().numpy() if masses else np.zeros(0)
    return result


def _cases(outfit, position, target, n_unknown: int, log_prob, rank, shuffled=False) -> dict:
    """case_ranks's result, numpy arrays in outfit order; None: no cases; False: not computed."""
    result = {
        "outfit": outfit.cpu().numpy(),
        "position": position.cpu().numpy(),
        "target": target.cpu().numpy(),
        "log_prob": np.zeros(0) if log_prob is None else log_prob.double().cpu().numpy(),
        "n_unknown_targets": np.int64(n_unknown),
    }
    if shuffled is not False:
        result["log_prob_shuffled"] = np.zeros(0) if shuffled is None else shuffled.double().cpu().numpy()
    if rank is not False:
        result["rank"] = np.zeros(0, dtype=np.int64) if rank is None else rank.cpu().numpy()
    return result


def _count_model_cases(model, items, context, outfit, position, target, n_unknown: int, with_ranks: bool) -> dict:
    """case_ranks for a count model with `ranked_cases(others, context, target, with_ranks) -> (log_prob,
    rank or None)`: the same ranks and log-probabilities from its closed form, a chunk of cases at a time, without
    scoring the catalogue for each case (the rank from the order of its few score vectors, `ScoreOrder`)."""
    log_probs, ranks = [], []
    bar = progress(len(target), f"{scorer_name(model)} ranking", "case")
    with torch.no_grad(), bar:
        for start in range(0, len(target), CLOSED_FORM_CASES):
            o, p, t = (v[start : start + CLOSED_FORM_CASES] for v in (outfit, position, target))
            others = items[o].clone()
            others[torch.arange(len(o), device=items.device), p] = PAD_INDEX
            log_prob, rank = model.ranked_cases(
                others, {name: values[o] for name, values in context.items()}, t, with_ranks
            )
            log_probs.append(log_prob.double())
            ranks.append(rank)
            bar.update(len(o))
    return _cases(
        outfit,
        position,
        target,
        n_unknown,
        torch.cat(log_probs) if log_probs else None,
        (torch.cat(ranks) if ranks else None) if with_ranks else False,
    )
