"""Where a ranker loses on the targets never seen in training (issue 71): their test cross-entropy in three parts
that add up, for a trained model and for the attribute-aware popularity on the same cases:

    -log P(a | O) = -log P(v(a) | O)                      the value of evaluate.popularity_attribute (the type)
                    -log P(no id | v(a), O)                the share of that value's mass on its articles without an id
                    -log P(a | no id, v(a), O)             a's share among them

The count spreads the third part evenly over a value's new articles; a model that loses there ranks new articles
within a type by what its attributes learnt from the known ones. Every case of every test outfit (each item masked
in turn), as unseen_mass.py.

`per_value_share`: the model's mean share of a value's mass on its new articles (over the test cases whose target
has that value), beside U_v / (p K_v + U_v) (U_v new and K_v known articles of the value, p the id dropout: how many
of the value's [UNK]-read rows in training were new articles), and the test targets' own share per value.
`per_value_offset`: the model scored with the offset of its new articles set per value, log((p K_v + U_v) / U_v)
less its catalogue-wide value (ArticleAttributes.calibrate_unseen's argument applied per value), and the
catalogue-wide offset fitted again on validation (training/unseen_fit.best_delta): what that would recover.

    python studies/article_vectors/unseen_parts.py --project /tmp/av/sparse_attributes_ids03 --model none_attrs
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `studies.`: a folder of scripts, not a package
from contextual_bert.data import MASK_INDEX, N_SPECIAL, PAD_INDEX  # noqa: E402
from contextual_bert.training import best_delta  # noqa: E402
from studies.article_vectors.unseen_mass import BATCH, cli, load_trained  # noqa: E402

PARTS = ("value", "no_id_share", "within")
MIN_CASES = 20  # per_value_share: the values with at least this many test targets


def parts(cases_scored: dict) -> dict:
    """Mean of each part over the cases (from `scored`) whose target has no id, and their sum (the cross-entropy
    there)."""
    u = cases_scored["unseen"]
    log_value, log_share, log_prob = (cases_scored[k][u] for k in ("log_value_mass", "log_value_share", "log_prob"))
    means = {"value": -log_value.mean(), "no_id_share": -log_share.mean(),
             "within": -(log_prob - log_value - log_share).mean()}  # fmt: skip
    return {
        "cases": int(u.sum()),
        **{k: float(v) for k, v in means.items()},
        "cross_entropy_unseen": float(sum(means.values())),
    }


def cases(items: torch.Tensor):
    """(outfit, position, target) of every case of `items` whose target is a real article."""
    outfit, position = (items != PAD_INDEX).nonzero(as_tuple=True)
    target = items[outfit, position]
    keep = target >= N_SPECIAL
    return outfit[keep], position[keep], target[keep]


def scored(scorer, split, extra: torch.Tensor, values: torch.Tensor, n_ids: int):
    """Per case of `split`, as scored: log P(target), log P(its value), log P(no id | its value); with `extra` added
    to the logits: log P(target) and the mass on the rows without an id."""
    outfit, position, target = cases(split.items)
    n_values = int(values.max()) + 1
    no_id = torch.arange(len(values)) >= n_ids
    out = {"log_prob": [], "log_prob_extra": [], "mass_extra": [], "log_value_mass": [], "log_value_share": []}
    with torch.no_grad():
        for start in range(0, len(target), BATCH):
            o, p, t = outfit[start : start + BATCH], position[start : start + BATCH], target[start : start + BATCH]
            masked = split.items[o].clone()
            masked[torch.arange(len(o)), p] = MASK_INDEX
            logits = scorer.masked_logits(masked, {name: v[o] for name, v in split.context.items()}).double()
            logits[:, :N_SPECIAL] = float("-inf")
            probs, rows = torch.softmax(logits, dim=1), torch.arange(len(o))
            index = values.expand(len(o), -1)
            value_mass = torch.zeros(len(o), n_values, dtype=probs.dtype).scatter_add_(1, index, probs)
            new_mass = torch.zeros_like(value_mass).scatter_add_(1, index, probs * no_id)
            out["log_value_mass"].append(value_mass[rows, values[t]].log())
            out["log_value_share"].append((new_mass[rows, values[t]] / value_mass[rows, values[t]]).log())
            out["log_prob"].append(torch.log_softmax(logits, dim=1)[rows, t])
            shifted = logits + extra
            out["log_prob_extra"].append(torch.log_softmax(shifted, dim=1)[rows, t])
            out["mass_extra"].append(torch.softmax(shifted, dim=1)[:, n_ids:].sum(dim=1))
    return {k: torch.cat(v).numpy() for k, v in out.items()} | {"unseen": (target >= n_ids).numpy(), "target": target}


def rows_share(values: torch.Tensor, n_ids: int, rate: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per value: its articles without an id U_v, and U_v / (rate K_v + U_v), the share of its [UNK]-read rows in
    training that are new articles (K_v its articles with an id); 0 where it has no new article."""
    no_id, real = torch.arange(len(values)) >= n_ids, torch.arange(len(values)) >= N_SPECIAL
    n_values = int(values.max()) + 1
    new = torch.bincount(values[no_id], minlength=n_values).double()
    known = torch.bincount(values[real & ~no_id], minlength=n_values).double()
    return new, torch.where(new > 0, new / (rate * known + new), 0.0)


def per_value_extra(values: torch.Tensor, n_ids: int, rate: float) -> torch.Tensor:
    """(n_items,) the per-value offset of the articles without an id, less its catalogue-wide value; 0 elsewhere."""
    new, share = rows_share(values, n_ids, rate)
    overall = new.sum() / (new.sum() + rate * (n_ids - N_SPECIAL))
    offset = torch.where(new > 0, overall.log() - share.clamp(min=1e-12).log(), 0.0)
    return torch.where(torch.arange(len(values)) >= n_ids, offset[values], 0.0)


def per_value(model, val, t: dict, values: torch.Tensor, n_ids: int, rate: float) -> dict:
    """per_value_share and per_value_offset (the module's docstring); `t`: the model's test cases from `scored`
    with per_value_extra."""
    v = scored(model, val, per_value_extra(values, n_ids, rate), values, n_ids)
    delta, _, _ = best_delta(v["log_prob_extra"], v["mass_extra"], v["unseen"])
    refit = t["log_prob_extra"] + delta * t["unseen"] - np.log1p(t["mass_extra"] * math.expm1(delta))
    new, share = rows_share(values, n_ids, rate)
    by_value = values[t["target"]].numpy()
    shown = [x for x in range(len(new)) if (by_value == x).sum() >= MIN_CASES and new[x] > 0]
    model_share = np.array([np.exp(t["log_value_share"][by_value == x]).mean() for x in shown])
    target_share = np.array([t["unseen"][by_value == x].mean() for x in shown])
    expected = share[shown].numpy()

    def ce(log_prob: np.ndarray) -> dict:
        u = t["unseen"]
        return {
            "all": float(-log_prob.mean()),
            "known": float(-log_prob[~u].mean()),
            "unseen": float(-log_prob[u].mean()),
        }

    return {
        "per_value_share": {
            "values": len(shown), "min_cases": MIN_CASES, "model_share_mean": float(model_share.mean()),
            "model_share_sd": float(model_share.std()), "target_share_mean": float(target_share.mean()),
            "corr_model_share_rows_share": float(np.corrcoef(model_share, expected)[0, 1]),
            "corr_target_share_rows_share": float(np.corrcoef(target_share, expected)[0, 1]),
        },
        "per_value_offset": {"id_dropout": rate, "refit_delta": delta, "as_scored": ce(t["log_prob"]),
                             "per_value": ce(refit)},
    }  # fmt: skip


def measure(project: Path, model_name: str, seed: int = 0) -> dict:
    t = load_trained(project, model_name, seed)
    attribute, n_ids = t.cfg.evaluate.popularity_attribute, t.catalogue.n_ids
    values = torch.as_tensor(t.catalogue.attributes[attribute], dtype=torch.long)
    rate = json.loads((t.run / "metrics.json").read_text())["id_dropout"]
    scored_model = scored(t.model, t.test, per_value_extra(values, n_ids, rate), values, n_ids)
    return {
        "attribute": attribute,
        model_name: parts(scored_model),
        "popularity_attribute": parts(scored(t.count, t.test, torch.zeros(len(values)), values, n_ids)),
        **per_value(t.model, t.val, scored_model, values, n_ids, rate),
    }


if __name__ == "__main__":
    raise SystemExit(cli(measure, __doc__))
