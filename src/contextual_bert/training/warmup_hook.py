"""The bag warm-up (warmup.py) at the Trainer's fixed points: its own module, as it reads the run's state
(resume.RunState), which holds the warm-up's."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from contextual_bert.config import TrainConfig
from contextual_bert.data.feature_spec import EncodedOutfits
from contextual_bert.model.scores import OutfitModel
from contextual_bert.training.resume import RunState
from contextual_bert.training.warmup import reads_bag_warmup, set_bag_weight, stuck_check


class BagWarmupHook:
    """The warm-up at the trainer's fixed points, for the run's model, settings and validation split: the epoch's
    weight (and the warm-up begun) before its steps; the stuck check after its validation; the warm-up's end after
    the epoch is recorded; none of it for a model that does not read it (`reads_bag_warmup`). The warm-up's state
    is the run's (`RunState.bag_warmup`, in last.pt)."""

    def __init__(self, cfg: TrainConfig, model: OutfitModel, val_data: EncodedOutfits, device: torch.device):
        self.cfg, self.model, self.val_data, self.device = cfg, model, val_data, device
        self.applies = reads_bag_warmup(cfg, model)

    def before_epoch(self, state: RunState, epoch: int, optimizer, scheduler, measure: Callable[[], float]) -> float:
        """The bag's weight in `epoch`'s steps, set on the model; at the warm-up's first epoch, what the run has
        before it kept (a warm-up from epoch 1 is judged against the untrained model: `measure`)."""
        warmup = state.bag_warmup
        weight = warmup.weight(self.cfg, self.model, epoch)
        if warmup.phase == "planned" and epoch in warmup.epochs(self.cfg, self.model):
            best = state.best_val if math.isfinite(state.best_val) else measure()
            warmup.begin(self.model, optimizer, scheduler, best, state.bad_epochs)
        set_bag_weight(self.model, weight)
        return weight

    def after_validation(self, state: RunState, row: dict, weight: float, steps_done: int) -> None:
        """The row's warm-up columns; the stuck check once train.bag_warmup_check_steps steps are done."""
        if not self.applies:
            return
        warmup, check_steps = state.bag_warmup, self.cfg.bag_warmup_check_steps
        row["bag_weight"] = weight
        if warmup.phase == "due" and check_steps is not None and steps_done >= check_steps:
            batch_size = 4 * self.cfg.batch_size
            warmup.checked(stuck_check(self.model, self.val_data, batch_size, self.device, row["epoch"]))
            row["outfit_dependence"] = warmup.outfit_dependence

    def after_record(self, state: RunState, row: dict, optimizer, scheduler) -> None:
        """After the warm-up's last epoch is recorded: did it lift validation? If not, what the run had before it
        comes back, its early-stopping count included."""
        warmup = state.bag_warmup
        if warmup.phase == "running" and row["epoch"] == warmup.epochs(self.cfg, self.model)[-1]:
            bad_epochs_before = warmup.end(state.best_val, self.model, optimizer, scheduler)
            row["bag_warmup_restored"] = bad_epochs_before is not None
            if bad_epochs_before is not None:
                state.bad_epochs = bad_epochs_before

    def finish(self) -> None:
        """After training: the model as evaluation and serving read it (no bag in the head state)."""
        set_bag_weight(self.model, 0.0)

    def metrics(self, state: RunState) -> dict:
        """metrics.json's "bag_warmup": where the warm-up applied and was decided."""
        return {"bag_warmup": state.bag_warmup.summary()} if self.applies and state.bag_warmup.phase != "due" else {}
