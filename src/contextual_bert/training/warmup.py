"""The warm-up from the bag of items, a training mode of the paper's encoders (train.bag_warmup_epochs): for N
epochs the head state also gets w * the outfit's bag (readers.OutfitBag), w falling from 1 to 0; with
train.bag_warmup_check_steps it runs only for an encoder the stuck check finds not reading the outfit.

A warm-up cannot harm: the weights, optimizer and schedule state from before it are kept (in last.pt, so a run
killed during it resumes exactly), and if its epochs bring no better validation cross-entropy than the run had
before it, the run takes them back and goes on as the paper's model (`begin_warmup`, `end_warmup`)."""

from __future__ import annotations

import copy
import math

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


def bag_warmup_plan(cfg: TrainConfig, model) -> dict | None:
    """A run's warm-up before any check: {"from": first epoch or None}; None while the stuck check is due."""
    if not reads_bag_warmup(cfg, model):
        return {"from": None}
    return {"from": 1} if cfg.bag_warmup_check_steps is None else None


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


def warmup_epochs(cfg: TrainConfig, model, plan: dict | None) -> range:
    """The epochs the warm-up of a run's `plan` ({"from": epoch or None}) runs, empty when none."""
    start = (plan or {}).get("from")
    if start is None or not reads_bag_warmup(cfg, model):
        return range(0)
    return range(start, start + cfg.bag_warmup_epochs)


def begin_warmup(plan: dict, model, optimizer, scheduler, best_val: float, bad_epochs: int) -> None:
    """Keep, in the run's plan (saved in last.pt), what the warm-up may have to give back: weights, optimizer
    and schedule state, and the early-stopping state, as they are before its first epoch."""
    plan["before"] = {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
                      "optimizer": copy.deepcopy(optimizer.state_dict()),
                      "scheduler": copy.deepcopy(scheduler.state_dict()),
                      "best_val": best_val, "bad_epochs": bad_epochs}


def end_warmup(plan: dict, state: dict, model, optimizer, scheduler) -> bool:
    """After the warm-up's last epoch: did it lift validation (a best validation cross-entropy below the one
    before it)? If not, the weights, optimizer, schedule and early-stopping state from before it come back.
    Returns whether they did; the plan records it."""
    before = plan.pop("before")
    lifted = state["best_val"] < before["best_val"] or not math.isfinite(before["best_val"])
    plan["lifted"] = bool(lifted)
    if not lifted:
        model.load_state_dict(before["model"])
        optimizer.load_state_dict(before["optimizer"])
        scheduler.load_state_dict(before["scheduler"])
        state["bad_epochs"] = before["bad_epochs"]
    return not lifted
