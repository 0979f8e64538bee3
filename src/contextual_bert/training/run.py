"""A run while it trains, as a few typed pieces built by keyword: what it is (`RunSetup`), its data (`RunData`),
its optimisation (`Optimisation`) and its state so far (resume.RunState: what last.pt keeps)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from contextual_bert.config import TrainConfig
from contextual_bert.data.feature_spec import EncodedOutfits
from contextual_bert.model import OutfitModel
from contextual_bert.training.losses import NegativeSampler
from contextual_bert.training.regularisers import RareIdDecay
from contextual_bert.training.resume import RunState


@dataclass(frozen=True, kw_only=True)
class RunSetup:
    """What the run is: the model, its settings (`auto` decided: `sparse_recipe` says how), where it writes, its
    seed, its device and its key (what last.pt must match to be resumed)."""

    model: OutfitModel
    cfg: TrainConfig
    out_dir: Path
    seed: int
    device: torch.device
    key: dict
    sparse_recipe: dict | None = None  # what train.init_output / rare_id_decay "auto" decided (sparse.py)


@dataclass(frozen=True, kw_only=True)
class RunData:
    """The splits on the device: training, validation (early stopping reads it) and the training probe (a fixed
    sample of training outfits measured as validation is; None: none)."""

    train: EncodedOutfits
    val: EncodedOutfits
    probe: EncodedOutfits | None = None


@dataclass(frozen=True, kw_only=True)
class Optimisation:
    """What a step changes besides the weights: optimizer, schedule, the run's generator (shuffling, masking), the
    sampled softmax's sampler (None: the full softmax) and the rare ids' decay (None: off)."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    generator: torch.Generator
    sampler: NegativeSampler | None = None
    rare_id_decay: RareIdDecay | None = None


@dataclass(kw_only=True)
class Run:
    """One training while it runs."""

    setup: RunSetup
    data: RunData
    optim: Optimisation
    state: RunState

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.data.train) / self.setup.cfg.batch_size)
