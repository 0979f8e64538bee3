"""How much probability a catalogue ranker puts on the articles without an id (never seen in training), against
how often a test target is one: the calibration between known and new articles (issue 71). Per model: the mean
over the test cases (each item of each test outfit masked in turn, the evaluation's cases) of the softmax mass on
the catalogue rows without an id, beside the share of those cases whose target has none, and the cross-entropy
on all, known and unseen targets; for the trained model with its calibration offset (unseen_offset, as evaluated),
with it set to 0 (as before the offset existed) and with it fitted on validation (training/unseen_fit.py), and for
the attribute-aware popularity. A model whose mass is far below the share gives new articles too little.

    python studies/article_vectors/unseen_mass.py --project /tmp/article_vectors/hm_no_text --model none_attrs
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from contextual_bert.config import load_config
from contextual_bert.data import MASK_INDEX, N_SPECIAL, PAD_INDEX, load_catalogue, load_split
from contextual_bert.evaluation import yardstick_model
from contextual_bert.model import load_checkpoint
from contextual_bert.training import fit_unseen_offset

BATCH = 256


def unseen_mass(scorer, test, n_ids: int) -> dict:
    """Mean softmax mass on rows >= n_ids over the test cases, and the share of cases whose target is such a row."""
    items = test.items
    outfit, position = (items != PAD_INDEX).nonzero(as_tuple=True)
    target = items[outfit, position]
    keep = target >= N_SPECIAL
    outfit, position, target = outfit[keep], position[keep], target[keep]
    mass, log_prob = [], []
    with torch.no_grad():
        for start in range(0, len(target), BATCH):
            o, p = outfit[start : start + BATCH], position[start : start + BATCH]
            masked = items[o].clone()
            masked[torch.arange(len(o)), p] = MASK_INDEX
            context = {name: values[o] for name, values in test.context.items()}
            logits = scorer.masked_logits(masked, context).float()
            logits[:, :N_SPECIAL] = float("-inf")
            probs = torch.softmax(logits, dim=1)
            mass.append(probs[:, n_ids:].sum(dim=1))
            log_prob.append(torch.log_softmax(logits, dim=1).gather(1, target[start : start + BATCH, None])[:, 0])
    mass, log_prob = torch.cat(mass), torch.cat(log_prob)
    unseen = target >= n_ids
    return {
        "cases": len(target),
        "cross_entropy": float(-log_prob.mean()),
        "cross_entropy_known": float(-log_prob[~unseen].mean()) if (~unseen).any() else None,
        "cross_entropy_unseen": float(-log_prob[unseen].mean()) if unseen.any() else None,
        "unseen_target_share": float(unseen.float().mean()),
        "mean_unseen_mass": float(mass.mean()),
        "mean_unseen_mass_on_unseen_targets": float(mass[unseen].mean()) if unseen.any() else None,
        "mean_unseen_mass_on_known_targets": float(mass[~unseen].mean()) if (~unseen).any() else None,
    }


@dataclass
class Trained:
    """A study project's trained `_attrs` model over its catalogue, its splits and its attribute-aware popularity."""

    cfg: object
    catalogue: object
    val: object
    test: object
    model: object
    count: object
    run: Path  # the model's folder (checkpoint.pt, metrics.json)


def load_trained(project: Path, model_name: str, seed: int = 0) -> Trained:
    params = yaml.safe_load((project / "params.yaml").read_text())
    cfg = load_config(project / "params.yaml")
    features = Path(params["paths"]["features_dir"])
    catalogue = load_catalogue(features)
    test = load_split(features, "test", cfg.model.max_set_size, catalogue=True)
    run = Path(params["paths"]["models_dir"]) / f"{model_name}-s{seed}"
    model, _ = load_checkpoint(run / "checkpoint.pt")
    model.set_catalogue(catalogue.tensors())
    model.eval()
    val = load_split(features, "val", cfg.model.max_set_size, catalogue=True)
    count = yardstick_model("popularity_attribute", features, cfg.evaluate, cfg.model.max_set_size, val)
    return Trained(cfg, catalogue, val, test, model, count, run)


def cli(measure, doc: str) -> int:
    """The command line of a script whose `measure(project, model)` returns a JSON-able dict."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    print(json.dumps(measure(args.project, args.model), indent=1))
    return 0


def measure(project: Path, model_name: str, seed: int = 0) -> dict:
    t = load_trained(project, model_name, seed)
    catalogue, val, test, model, count = t.catalogue, t.val, t.test, t.model, t.count
    offset = model.attributes.unseen_offset
    calibrated = unseen_mass(model, test, catalogue.n_ids)
    # the checkpoint's offset moved to its optimum on the whole validation split (training fits it on at most
    # train.validation_outfits of them: the same where validation is smaller; a checkpoint of that code: ~0 moved)
    fit = fit_unseen_offset(model, val, BATCH, "cpu", start=offset)
    fitted = unseen_mass(model, test, catalogue.n_ids) if fit is not None else None
    model.set_unseen_offset(0.0)
    return {
        "n_ids": catalogue.n_ids,
        "n_rows": int(model.n_items),
        "unseen_offset": offset,
        model_name: calibrated,
        f"{model_name} without the offset": unseen_mass(model, test, catalogue.n_ids),
        f"{model_name} with the offset fitted on validation": fitted,
        "fitted_offset": fit,
        "popularity_attribute": unseen_mass(count, test, catalogue.n_ids),
    }


if __name__ == "__main__":
    raise SystemExit(cli(measure, __doc__))
