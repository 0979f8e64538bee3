"""The offset of the articles without an id, fitted on validation after training (the `_attrs` models).

`ArticleAttributes.calibrate_unseen` sets the offset from counts at the start of training: it restores the mass
the [UNK]-read group had in training. That is not the mass validation asks for: a model's history or outfit
offsets, or what it learned of the known articles, move mass between the two groups as well (`docs/decisions.md`).
So the best checkpoint's offset is moved by the delta that minimises the validation cross-entropy, a convex problem
in one variable. With each validation case's log-probability l_i and mass m_i on the articles without an id at the
starting offset, and u_i whether its target is one, a delta d gives l_i + d u_i - log(1 - m_i + m_i e^d): one
ranking pass, then Newton steps. Its optimum is where the mean mass equals the share of such targets. Nothing changes (the same bits)
for a model without such articles or without such targets in validation.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from contextual_bert.config import TrainConfig
from contextual_bert.data.feature_spec import EncodedOutfits
from contextual_bert.model import OutfitModel, save_checkpoint
from contextual_bert.training.regularisers import id_dropout_rate, unseen_share

MAX_NEWTON_STEPS = 50
TOLERANCE = 1e-10  # on the derivative: mean mass minus the share of targets without an id
MAX_STEP = 2.0  # nats per Newton step (the curvature is small when the masses are near 0 or 1)


def best_delta(log_prob: np.ndarray, mass: np.ndarray, unseen: np.ndarray) -> tuple[float, float, float]:
    """(delta, cross-entropy at 0, cross-entropy at delta) minimising
    -mean(l_i + d u_i - log(1 - m_i + m_i e^d)) over d."""
    log_prob, mass, unseen = (np.asarray(a, dtype=np.float64) for a in (log_prob, mass, unseen))
    mass = np.clip(mass, 1e-300, 1.0 - 1e-16)
    share = float(unseen.mean())

    def loss(d: float) -> float:
        return float(-(log_prob + d * unseen - np.log1p(mass * math.expm1(d))).mean())

    delta = 0.0
    for _ in range(MAX_NEWTON_STEPS):
        q = mass * math.exp(delta) / (1.0 - mass + mass * math.exp(delta))
        gradient, curvature = float(q.mean()) - share, float((q * (1.0 - q)).mean())
        if abs(gradient) < TOLERANCE or curvature <= 0.0:
            break
        delta -= float(np.clip(gradient / curvature, -MAX_STEP, MAX_STEP))
    before, after = loss(0.0), loss(delta)
    return (delta, before, after) if after < before else (0.0, before, before)


def fit_unseen_offset(model, val_data, batch_size: int, device, start: float | None = None) -> dict | None:
    """Move `model`'s offset of the articles without an id (from `start`, None: the one it has) to its validation
    optimum, in place; what it did, or None where there is nothing to fit (no such articles, or no validation target
    among them)."""
    from contextual_bert.evaluation.ranking import case_ranks

    if getattr(model, "attributes", None) is None or model.n_items <= model.n_ids:
        return None
    if start is not None:
        model.set_unseen_offset(start)
    cases = case_ranks(model, val_data, batch_size, device, with_ranks=False, mass_from=model.n_ids)
    unseen = cases["target"] >= model.n_ids
    if not unseen.any():
        return None
    start = model.attributes.unseen_offset
    delta, before, after = best_delta(cases["log_prob"], cases["mass"], unseen)
    model.set_unseen_offset(start + delta)
    return {
        "start": start,
        "offset": start + delta,
        "val_cross_entropy_before": before,
        "val_cross_entropy_after": after,
        "val_unseen_target_share": float(unseen.mean()),
        "val_mean_unseen_mass_before": float(np.mean(cases["mass"])),
    }


class UnseenOffset:
    """An "_attrs" model's id dropout and offset of the articles without an id, at the trainer's fixed points: set
    at the run's start (`at_start`), fitted on validation in its best checkpoint at the end (`fit_best`); and what
    metrics.json says of them. `id_dropout` None: a model of ids only, for which it does nothing."""

    def __init__(self, id_dropout: float | None = None, start: float | None = None):
        self.id_dropout, self.start = id_dropout, start
        self.fit: dict | None = None

    @classmethod
    def at_start(cls, cfg: TrainConfig, model: OutfitModel, val_data: EncodedOutfits) -> UnseenOffset:
        """The rate set on the model and its offset calibrated (ArticleAttributes.calibrate_unseen), from the whole
        validation split; read by "_attrs" models only: the paper's models train as before."""
        if model.attributes is None:  # a model of ids (uses_attributes: no)
            return cls()
        id_dropout = id_dropout_rate(cfg.id_dropout, model, val_data)
        model.set_id_dropout(id_dropout, unseen_share(model, val_data))
        return cls(id_dropout, model.attributes.unseen_offset)

    def fit_best(self, model: OutfitModel, path: Path, val_data: EncodedOutfits, batch_size: int,
                 device: torch.device) -> None:  # fmt: skip
        """The best checkpoint (`path`) loaded into `model`, its offset fitted on validation from the offset training
        started with (so that a finished run asked again fits the same), and saved with the fit."""
        if self.id_dropout is None:
            return
        payload = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(payload["state_dict"])
        self.fit = fit_unseen_offset(model, val_data, batch_size, device, start=self.start)
        if self.fit is not None:
            save_checkpoint(path, model, {**payload.get("meta", {}), "unseen_offset_fit": self.fit})

    def metrics(self) -> dict:
        """The id dropout and the offset (fitted, where it was); nothing for a model of ids only."""
        if self.id_dropout is None:
            return {}
        if self.fit is None:
            return {"id_dropout": self.id_dropout, "unseen_offset": self.start}
        return {"id_dropout": self.id_dropout, "unseen_offset": self.fit["offset"], "unseen_offset_fit": self.fit}
