"""What a trained catalogue ranker would score mixed with its count (issue 71), after training, without training
again: P(a | O) = (1 - w) P_model(a | O) + w P_count(a | O), the count the attribute-aware popularity
(evaluate.popularity_attribute), w the one weight that maximises the validation log-likelihood (a concave problem
in w: bisection on its derivative). Reported on test: the model, the count and the mixture, on all, known and
unseen targets, and the mixture against the count and against the model (paired bootstrap over the test outfits,
the evaluation's). Every case of every outfit (each item masked in turn), as the evaluation ranks them
(evaluation.ranking.case_ranks).

Why: a model whose outfit dependence is about 0 (the sparse catalogue's attributes-only model) is a popularity
table, and a learned one is a little worse than the exact count; where the model reads the outfit the count still
holds what it estimates best (each type's share of new articles, the counts of the known ones). Not built into
src: a study of whether it would meet the issue's criteria.

    python studies/article_vectors/count_mixture.py --project /tmp/av/sparse_attributes_ids03 --model none_attrs
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `studies.`: a folder of scripts, not a package
from contextual_bert.evaluation import case_ranks, outfit_record, paired_difference  # noqa: E402
from studies.article_vectors.unseen_mass import BATCH, cli, load_trained  # noqa: E402

BISECTIONS = 60  # on [0, 1]: w to 1e-18


def mixture_weight(log_model: np.ndarray, log_count: np.ndarray) -> float:
    """argmax over w in [0, 1] of mean log((1 - w) p_m + w p_c), from the cases' log-probabilities. Its
    derivative, mean (p_c - p_m) / ((1 - w) p_m + w p_c), falls with w."""
    ratio = np.exp(np.asarray(log_count, dtype=np.float64) - np.asarray(log_model, dtype=np.float64))  # p_c / p_m

    def slope(w: float) -> float:
        return float(((ratio - 1.0) / (1.0 - w + w * ratio)).mean())

    if slope(0.0) <= 0.0:
        return 0.0
    if slope(1.0) >= 0.0:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(BISECTIONS):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if slope(mid) > 0.0 else (low, mid)
    return 0.5 * (low + high)


def mixed(log_model: np.ndarray, log_count: np.ndarray, w: float) -> np.ndarray:
    if w <= 0.0:
        return log_model
    if w >= 1.0:
        return log_count
    return np.logaddexp(np.log1p(-w) + log_model, np.log(w) + log_count)


def cases_of(scorer, split) -> dict:
    return case_ranks(scorer, split, BATCH, "cpu", with_ranks=False)


def measure(project: Path, model_name: str, seed: int = 0) -> dict:
    t = load_trained(project, model_name, seed)
    n_ids, splits = t.catalogue.n_ids, {"val": t.val, "test": t.test}
    scored = {name: (cases_of(t.model, split), cases_of(t.count, split)) for name, split in splits.items()}
    for model_cases, count_cases in scored.values():  # the same cases in the same order
        assert np.array_equal(model_cases["target"], count_cases["target"])
    (val_model, val_count), (test_model, test_count) = scored["val"], scored["test"]
    w = mixture_weight(val_model["log_prob"], val_count["log_prob"])
    outfit, unseen = test_model["outfit"], test_model["target"] >= n_ids
    log_probs = {
        model_name: test_model["log_prob"],
        "count": test_count["log_prob"],
        "mixture": mixed(test_model["log_prob"], test_count["log_prob"], w),
    }
    ids = list(range(len(t.test.items)))

    def record(log_prob: np.ndarray, keep: np.ndarray) -> dict:
        return outfit_record(outfit[keep], {"cross_entropy": -log_prob[keep]}, ids)

    def ce(log_prob: np.ndarray) -> dict:
        parts = {"all": np.ones_like(unseen), "known": ~unseen, "unseen": unseen}
        return {k: (float(-log_prob[m].mean()) if m.any() else None) for k, m in parts.items()}

    against = {}
    for other in ("count", model_name):
        for part, keep in (("all", np.ones_like(unseen)), ("unseen", unseen)):
            if keep.any():
                diff = paired_difference(record(log_probs["mixture"], keep), record(log_probs[other], keep),
                                         "cross_entropy")  # fmt: skip
                against[f"mixture - {other} ({part})"] = {"difference": diff["difference"],
                                                          "interval": diff["interval"]}  # fmt: skip
    return {
        "weight": w,
        "val_cross_entropy": {
            model_name: float(-val_model["log_prob"].mean()),
            "mixture": float(-mixed(val_model["log_prob"], val_count["log_prob"], w).mean()),
        },
        "test": {name: ce(lp) for name, lp in log_probs.items()},
        "paired": against,
        "cases": {"test": int(len(unseen)), "test_unseen": int(unseen.sum())},
    }


if __name__ == "__main__":
    raise SystemExit(cli(measure, __doc__))
