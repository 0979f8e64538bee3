"""The warm-up from the bag of items, a training mode of the paper's encoders (train.bag_warmup_epochs): for N
epochs the head state also gets w * the outfit's bag (readers.OutfitBag), w falling from 1 to 0; with
train.bag_warmup_check_steps it runs only for an encoder the stuck check finds not reading the outfit."""

from __future__ import annotations

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
