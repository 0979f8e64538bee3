"""Full-ranking evaluation: every item of every held-out outfit is masked in turn and ranked against the
whole article vocabulary (never sampled negatives).

A case is (outfit, position). Its target is ranked among the real articles, the outfit's other items
excluded; the special indices are never ranked. Ties (which only a constant scorer such as the popularity
baseline has) are broken by article index, so a rank is a position in one deterministic order:
rank = 1 + #{a : s_a > s_t} + #{a < t : s_a = s_t}. A target that is [UNK] (an article unseen in training)
cannot be ranked: it is skipped and counted. Cross-entropy is the full softmax over all real articles.

The popularity baseline goes through the same code: its scores are log(1 + training count).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from contextual_bert.bootstrap import bootstrap_ci, case_values
from contextual_bert.config import EvaluateConfig, ModelConfig
from contextual_bert.devices import evaluation_device, keep_freed_memory
from contextual_bert.errors import ContextualBertError
from contextual_bert.feature_spec import MASK_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX, EncodedOutfits
from contextual_bert.model import count_paper_parameters, load_checkpoint

RECALL_CURVE_MAX_K = 250


class PopularityModel(nn.Module):
    """Scores every article by its training count, whatever the outfit and the customer."""

    def __init__(self, counts):
        super().__init__()
        counts = torch.tensor(np.array(counts, dtype=np.float64))
        scores = torch.log1p(counts).float()
        scores[:N_SPECIAL] = float("-inf")
        self.register_buffer("scores", scores)
        self.n_items = len(scores)

    def masked_logits(self, items: torch.Tensor, context=None) -> torch.Tensor:
        return self.scores.expand(items.shape[0], -1).clone()


def case_ranks(model, data: EncodedOutfits, batch_size: int, device, with_ranks: bool = True) -> dict:
    """Rank and log-probability of the target of every case (every non-padding item of every outfit).

    `model` is anything with `masked_logits(items, context) -> (B, n_items)` (a ContextualBert or the
    PopularityModel). Returns numpy arrays, one entry per rankable case, in outfit order: "outfit" (row of
    `data`), "position", "target" (article index), "rank" (1 = best; absent if not with_ranks), "log_prob";
    and "n_unknown_targets", the skipped cases whose target is [UNK].
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
    ranks, log_probs = [], []
    article_index = torch.arange(getattr(model, "n_items"), device=device)
    with torch.no_grad():  # fp32 on every device: bf16 logits tie, and ties would be broken by article index
        for start in range(0, len(target), batch_size):
            rows = by_length[start : start + batch_size]
            o, p, t = outfit[rows], position[rows], target[rows, None]
            masked = items[o, : int(lengths[o].max())].clone()
            masked[torch.arange(len(o), device=device), p] = MASK_INDEX
            logits = model.masked_logits(masked, {name: values[o] for name, values in context.items()}).float()
            logits[:, :N_SPECIAL] = float("-inf")  # never ranked, whatever the scorer says
            target_logit = logits.gather(1, t)
            log_probs.append(target_logit - torch.logsumexp(logits[:, N_SPECIAL:], dim=1, keepdim=True))
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
    if with_ranks:
        result["rank"] = in_outfit_order(ranks).cpu().numpy() if ranks else np.zeros(0, dtype=np.int64)
    return result


def metrics_from_ranks(ranks, log_probs, ks=(1, 5, 10, 50, 250)) -> dict:
    """Cross-entropy (nats), recall@k, MRR and NDCG@10 of cases with one relevant article each."""
    ranks = np.asarray(ranks, dtype=np.float64)
    log_probs = np.asarray(log_probs, dtype=np.float64)
    if len(ranks) != len(log_probs):
        raise ValueError(f"{len(ranks)} ranks but {len(log_probs)} log-probabilities")
    if (ranks < 1).any():
        raise ValueError("ranks start at 1")
    n = len(ranks)

    def mean(values) -> float | None:
        return float(np.mean(values)) if n else None

    metrics = {"n_cases": n, "cross_entropy": mean(-log_probs)}
    for k in ks:
        metrics[f"recall@{k}"] = mean(ranks <= k)
    metrics["mrr"] = mean(1.0 / ranks)
    metrics["ndcg@10"] = mean(np.where(ranks <= 10, 1.0 / np.log2(ranks + 1.0), 0.0))
    return metrics


def recall_curve(ranks, max_k: int = RECALL_CURVE_MAX_K) -> dict:
    ranks = np.asarray(ranks)
    ks = list(range(1, max_k + 1))
    counts = np.bincount(np.minimum(ranks, max_k + 1).astype(np.int64), minlength=max_k + 2)
    cumulative = np.cumsum(counts)[1 : max_k + 1]
    return {"k": ks, "values": [float(c / len(ranks)) if len(ranks) else None for c in cumulative]}


def evaluate_split(model, data: EncodedOutfits, cfg: EvaluateConfig, device) -> tuple[dict, dict]:
    """The metrics of one split and its cases (see case_ranks)."""
    cases = case_ranks(model, data, cfg.batch_size, device)
    metrics = {
        "n_outfits": len(data),
        "n_unknown_targets": int(cases["n_unknown_targets"]),
        **metrics_from_ranks(cases["rank"], cases["log_prob"], cfg.ks),
    }
    return metrics, cases


def _evaluate(model, name, variant, seed, parameters, features_dir, max_set_size, out_path, cfg) -> dict:
    from contextual_bert.feature_store import load_split

    device = evaluation_device()
    if device.type == "cpu":
        keep_freed_memory()
    model.to(device)
    test, test_cases = evaluate_split(model, load_split(features_dir, "test", max_set_size), cfg, device)
    val, _ = evaluate_split(model, load_split(features_dir, "val", max_set_size), cfg, device)
    test_ranks = test_cases["rank"]
    curve = recall_curve(test_ranks)
    result = {
        "name": name,
        "variant": variant,
        "seed": seed,
        "parameters": parameters,
        "test": test,
        "val": val,
        # how much the test metrics move with the test outfits themselves (bootstrap.py)
        "test_bootstrap": bootstrap_ci(test_cases["outfit"], case_values(test_ranks, test_cases["log_prob"]),
                                       n_outfits=test["n_outfits"]),
        "recall_curve": {"k": curve["k"], "test": curve["values"]},
    }
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2))
    return result


def evaluate_run(features_dir: Path, run_dir: Path, out_path: Path, cfg: EvaluateConfig) -> dict:
    """Evaluate run_dir/checkpoint.pt on the test (and validation) split; write out_path (JSON)."""
    from contextual_bert.feature_store import load_article_vocab

    run_dir = Path(run_dir)
    if not (run_dir / "checkpoint.pt").exists() and (run_dir / "history.json").exists():
        # trained, yet no epoch gave a finite validation cross-entropy: training again will not help
        raise ContextualBertError(
            f"{run_dir}: trained ({run_dir / 'history.json'}) but no checkpoint was kept: no epoch had a finite "
            "validation cross-entropy; check the validation split (`contextual-bert features`, "
            "features.min_known_targets) before training again")
    model, meta = load_checkpoint(run_dir / "checkpoint.pt")
    n_items = len(load_article_vocab(features_dir))
    if n_items != model.n_items:
        raise ContextualBertError(
            f"{run_dir / 'checkpoint.pt'}: trained on {model.n_items} article indices but {features_dir} "
            f"has {n_items}; the features changed since training, train again"
        )
    return _evaluate(model, run_dir.name, model.variant, meta.get("seed"), count_paper_parameters(model),
                     features_dir, model.model_cfg.max_set_size, out_path, cfg)  # fmt: skip


def evaluate_popularity(
    features_dir: Path, out_path: Path, cfg: EvaluateConfig, max_set_size: int = ModelConfig().max_set_size
) -> dict:
    """The popularity baseline (training counts) through the same ranking code; write out_path (JSON)."""
    from contextual_bert.feature_store import load_article_vocab

    counts = np.asarray(load_article_vocab(features_dir).counts)
    if not math.isfinite(float(counts.sum())) or (counts < 0).any():
        raise ContextualBertError(f"{features_dir}: article counts must be finite and non-negative")
    return _evaluate(PopularityModel(counts), "popularity", "popularity", None, 0,
                     features_dir, max_set_size, out_path, cfg)  # fmt: skip
