"""What a count can read from the customer's record beyond popularity + own history (issue 57): how often the
customer wore the candidate (a lift per worn count, as HistoryRepeat's v_k learns it) and the outfit's types (the
attribute-aware popularity's rule), each a count with a few weights fitted on validation, scored on test.

Every row is a base distribution B(a | O) over the catalogue lifted by the customer's history the way popularity +
own history lifts popularity:

    P(a | O, H) ∝ B(a | O) (1 + lambda(k) k(a) / (n p(a)))

for a history of n slots of which k(a) hold a (the features stage's history, as every model reads it) and p(a) the
article's popularity ((count + 1) / sum). With B = popularity and one lambda this is the yardstick itself, (1 - w) p
+ w k / n with w = lambda / (1 + lambda) (the `linear` row's weight is fitted, the yardstick's is the best of a
grid: the two agree to the grid's step). The rows:

- `popularity + own history` (linear): B = popularity, one lambda;
- `... by worn count`: B = popularity, one lambda per worn count 1 .. HistoryRepeat.WORN_LEVELS (the last for that
  many or more): what a model's repeat offset can reach with nothing else learned;
- `attribute-aware popularity + own history` (and `... by worn count`): B = the attribute-aware popularity
  (evaluation.counts.AttributePopularityModel, the baseline stage's, on evaluate.popularity_attribute): the count
  an "_attrs" model with history starts from, its type rule applied to the history's articles too.

Cases: every known target of the split (an article with an id), as the yardstick's; the lambdas by L-BFGS on
validation's mean cross-entropy; on test the paired bootstrap over outfits against the linear row.

    python studies/history_counts/repeat_shapes.py --kind closets            # or default, planted_hidden
    python studies/history_counts/repeat_shapes.py --data <a project's data folder> --name <name>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from contextual_bert.config import load_config
from contextual_bert.data import HISTORY_FEATURE, MASK_INDEX, N_SPECIAL, load_article_vocab, load_split
from contextual_bert.evaluation import attribute_popularity_model, bootstrap_ci
from contextual_bert.model import HistoryRepeat

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from studies.history_counts.history_counts import data_arguments, parse_data  # noqa: E402
from studies.project import record  # noqa: E402

LEVELS = HistoryRepeat.WORN_LEVELS
MAX_SET_SIZE = 8
CHUNK = 512  # cases per dense pass of the attribute-aware popularity


class Cases:
    """One split's known-target cases, as the tensors the lifted counts need: per case the base's log-probability
    of the target, the target's lift term k / (n p) and worn level, and per worn level the sum over the history's
    articles of B(a | O) k(a) / (n p(a)) (the lift's share of the normaliser)."""

    def __init__(self, features: Path, split: str, probs: torch.Tensor, base):
        ids = load_split(features, split, MAX_SET_SIZE)
        n_ids = len(probs)
        attrs = load_split(features, split, MAX_SET_SIZE, catalogue=True) if base is not None else None
        rows, positions = ((ids.items >= N_SPECIAL) & (ids.items < n_ids)).nonzero(as_tuple=True)
        self.outfit = rows.numpy()
        history = ids.context[HISTORY_FEATURE][rows]
        held = history >= N_SPECIAL
        n = held.sum(dim=1).clamp_min(1).double()
        worn = ((history[:, :, None] == history[:, None, :]) & held[:, None, :]).sum(dim=2)
        first = held & ~torch.tril((history[:, :, None] == history[:, None, :]), diagonal=-1).any(dim=2)
        target = ids.items[rows, positions]
        k_target = ((history == target[:, None]) & held).sum(dim=1)
        log_base = torch.empty(len(rows), dtype=torch.float64)
        base_hist = torch.empty(history.shape, dtype=torch.float64)
        for start in range(0, len(rows), CHUNK):
            part = slice(start, start + CHUNK)
            if base is None:
                log_base[part] = probs[target[part]].log()
                base_hist[part] = probs[history[part]]
                continue
            items = attrs.items[rows[part]].clone()
            items[torch.arange(len(items)), positions[part]] = MASK_INDEX
            with torch.no_grad():
                logits = base.masked_logits(items).double()
            log_base[part] = logits.gather(1, target[part, None])[:, 0]
            # the ids' history holds [UNK] where the catalogue's holds an article without an id: not counted
            base_hist[part] = torch.where(held[part], logits.gather(1, history[part]).exp(), 0.0)
        share = torch.where(first, base_hist * worn / (n[:, None] * probs[history]), 0.0)
        level = worn.clamp(1, LEVELS) - 1
        self.norm_by_level = torch.zeros(len(rows), LEVELS, dtype=torch.float64).scatter_add_(1, level, share)
        self.log_base = log_base
        self.target_lift = (k_target / (n * probs[target])).double()
        self.target_level = k_target.clamp(1, LEVELS) - 1
        self.n_outfits = len(ids.items)

    def log_probs(self, log_lambda: torch.Tensor) -> torch.Tensor:
        """(cases,) log P(target | O, H) under log lambda, one value or one per worn level."""
        lam = log_lambda.exp().expand(LEVELS)
        norm = 1.0 + self.norm_by_level @ lam
        return self.log_base + torch.log1p(lam[self.target_level] * self.target_lift) - norm.log()


def fit(val: Cases, per_level: bool) -> torch.Tensor:
    log_lambda = torch.full((LEVELS if per_level else 1,), -2.0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_lambda], max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = -val.log_probs(log_lambda).mean()
        loss.backward()
        return loss

    opt.step(closure)
    return log_lambda.detach()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data_arguments(parser)
    args = parse_data(parser)
    features = args.data / "features"
    counts = torch.tensor(np.asarray(load_article_vocab(features).counts), dtype=torch.float64)
    probs = counts + 1.0
    probs[:N_SPECIAL] = 0.0
    probs = probs / probs.sum()
    probs[:N_SPECIAL] = 1.0  # never a target or a counted history article; keeps the divisions finite
    attribute, _, _ = attribute_popularity_model(features, load_config().evaluate, MAX_SET_SIZE)
    bases = {"popularity": None} | ({"attribute-aware popularity": attribute} if attribute is not None else {})

    result = {"data": args.name, "folder": str(args.data), "levels": LEVELS, "rows": {}}
    reference = None
    for base_name, base in bases.items():
        val, test = Cases(features, "val", probs, base), Cases(features, "test", probs, base)
        result["n_cases"] = {"val": len(val.log_base), "test": len(test.log_base)}
        for per_level in (False, True):
            name = f"{base_name} + own history" + (" by worn count" if per_level else "")
            log_lambda = fit(val, per_level)
            log_prob = test.log_probs(log_lambda).numpy()
            if reference is None:
                reference = log_prob  # popularity + own history, linear: the yardstick
            ci = bootstrap_ci(test.outfit, {"cross_entropy": -log_prob}, n_outfits=test.n_outfits)
            diff = bootstrap_ci(test.outfit, {"gain": log_prob - reference}, n_outfits=test.n_outfits)
            result["rows"][name] = {
                "lambda": [round(float(x), 4) for x in log_lambda.exp()],
                "val_cross_entropy": float(-val.log_probs(log_lambda).mean()),
                "test_cross_entropy": float(-log_prob.mean()),
                "test_ci": ci["cross_entropy"],
                "gain_over_the_yardstick": float((log_prob - reference).mean()),
                "gain_ci": diff["gain"],
            }
        result["rows"][f"{base_name} (no history)"] = {"test_cross_entropy": float(-test.log_base.mean())}
    record(HERE / "results.json", f"repeat_shapes_{args.name}", result)
    print(json.dumps(result["rows"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
