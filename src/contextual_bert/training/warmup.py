"""The warm-up from the bag of items, a training mode of the paper's encoders (train.bag_warmup_epochs): for N
epochs the head state also gets w * the outfit's bag (readers.OutfitBag), w falling from 1 to 0; with
train.bag_warmup_check_steps it runs only for an encoder the stuck check finds not reading the outfit.

A warm-up cannot harm: the weights, optimizer and schedule state from before it are kept (in last.pt, so a run
killed during it resumes exactly), and if its epochs bring no better validation cross-entropy than the run had
before it, the run takes them back and goes on as the paper's model (`BagWarmup.begin`, `BagWarmup.end`)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Literal

from contextual_bert.config import TrainConfig
from contextual_bert.data.feature_spec import EncodedOutfits
from contextual_bert.model.readers import OutfitBag


def _outfit_bag(model) -> OutfitBag | None:
    return model.reader(OutfitBag) if hasattr(model, "reader") else None


def reads_bag_warmup(cfg: TrainConfig, model) -> bool:
    """Does train.bag_warmup_epochs apply to `model`? The paper's encoders only, and not one whose bag path is
    already on (model.bag_path)."""
    bag = _outfit_bag(model)
    return cfg.bag_warmup_epochs > 0 and bag is not None and not bag.always


def bag_warmup_weight(cfg: TrainConfig, model, epoch: int, start: int | None = 1) -> float:
    """The bag state's weight in epoch `epoch` (1-based) of train.bag_warmup_epochs = N starting at epoch
    `start`: 1 - (epoch - start) / N, then 0; 0 before `start`, and throughout when `start` is None (the
    stuck check, train.bag_warmup_check_steps, has not asked for it)."""
    if start is None or epoch < start or not reads_bag_warmup(cfg, model):
        return 0.0
    return max(0.0, 1.0 - (epoch - start) / cfg.bag_warmup_epochs)


def stuck_check(model, val_data: EncodedOutfits, batch_size: int, device, epoch: int) -> dict:
    """train.bag_warmup_check_steps: the outfit dependence on validation at the end of `epoch`; under
    ranking.STUCK_BELOW the encoder predicts without reading the outfit, and the warm-up starts next epoch.
    Draws nothing from the training's random streams (the pairing of outfits has its own seed)."""
    from contextual_bert.evaluation.ranking import STUCK_BELOW, case_ranks, outfit_dependence

    cases = case_ranks(model, val_data, batch_size, device, with_ranks=False, dependence=True)
    dependence = outfit_dependence(cases["log_prob"], cases["log_prob_shuffled"])
    stuck = dependence is not None and dependence < STUCK_BELOW
    return {"checked_at_epoch": epoch, "outfit_dependence": dependence, "from": epoch + 1 if stuck else None}


def set_bag_weight(model, weight: float) -> None:
    """The warm-up's weight of the outfit bag in the head state, for the training steps that follow (evaluation
    never sees it: readers.OutfitBag reads it in training mode only)."""
    bag = _outfit_bag(model)
    if bag is not None:
        bag.warmup_weight = float(weight)


Phase = Literal["due", "planned", "running", "ended"]


@dataclass
class BagWarmup:
    """A run's warm-up from the bag, in four phases:

        due      the stuck check (train.bag_warmup_check_steps) has not run yet: no warm-up before it has
        planned  from epoch `start` (None: none, e.g. a model that does not read it, or one found not stuck)
        running  begun: `before` holds what the run had before it, to give back if it does not help
        ended    `lifted`: whether it brought a better validation cross-entropy than the run had before it

    Saved in last.pt as a dict of plain values and tensors (`to_dict`, `from_dict`)."""

    due: bool = False
    start: int | None = None
    checked_at_epoch: int | None = None
    outfit_dependence: float | None = None
    before: dict[str, Any] | None = None
    lifted: bool | None = None

    @classmethod
    def at_start(cls, cfg: TrainConfig, model) -> BagWarmup:
        """A run's warm-up before its first epoch: from epoch 1, due a check, or none."""
        if not reads_bag_warmup(cfg, model):
            return cls()
        return cls(start=1) if cfg.bag_warmup_check_steps is None else cls(due=True)

    @property
    def phase(self) -> Phase:
        if self.due:
            return "due"
        if self.lifted is not None:
            return "ended"
        return "running" if self.before is not None else "planned"

    def epochs(self, cfg: TrainConfig, model) -> range:
        """The epochs it runs (empty when none)."""
        if self.start is None or not reads_bag_warmup(cfg, model):
            return range(0)
        return range(self.start, self.start + cfg.bag_warmup_epochs)

    def weight(self, cfg: TrainConfig, model, epoch: int) -> float:
        """The bag state's weight in `epoch` (bag_warmup_weight; 0 while the check is due)."""
        return bag_warmup_weight(cfg, model, epoch, None if self.due else self.start)

    def checked(self, check: dict) -> None:
        """The stuck check's result (`stuck_check`): due no longer, planned from the next epoch if stuck."""
        self.due = False
        self.checked_at_epoch, self.outfit_dependence = check["checked_at_epoch"], check["outfit_dependence"]
        self.start = check["from"]

    def begin(self, model, optimizer, scheduler, best_val: float, bad_epochs: int) -> None:
        """Keep what the warm-up may have to give back: weights, optimizer and schedule state, and the
        early-stopping state, as they are before its first epoch."""
        self.before = {
            "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "scheduler": copy.deepcopy(scheduler.state_dict()),
            "best_val": best_val,
            "bad_epochs": bad_epochs,
        }

    def end(self, best_val: float, model, optimizer, scheduler) -> int | None:
        """After its last epoch: did it lift validation (a best validation cross-entropy `best_val` below the
        one before it)? If not, the weights, optimizer and schedule state from before it come back, and the
        early-stopping count from then is returned (None when it lifted)."""
        before, self.before = self.before, None
        assert before is not None, "a warm-up ends only after it began"
        self.lifted = bool(best_val < before["best_val"] or not math.isfinite(before["best_val"]))
        if self.lifted:
            return None
        model.load_state_dict(before["model"])
        optimizer.load_state_dict(before["optimizer"])
        scheduler.load_state_dict(before["scheduler"])
        return before["bad_epochs"]

    def summary(self) -> dict:
        """What metrics.json says of it: the check (when one ran), its first epoch ("from"), whether it lifted."""
        checked = (
            {"checked_at_epoch": self.checked_at_epoch, "outfit_dependence": self.outfit_dependence}
            if self.checked_at_epoch is not None
            else {}
        )
        return {**checked, "from": self.start, **({} if self.lifted is None else {"lifted": self.lifted})}

    def to_dict(self) -> dict:
        return {
            "due": self.due,
            "start": self.start,
            "checked_at_epoch": self.checked_at_epoch,
            "outfit_dependence": self.outfit_dependence,
            "before": self.before,
            "lifted": self.lifted,
        }

    @classmethod
    def from_dict(cls, saved: dict) -> BagWarmup:
        return cls(**saved)
