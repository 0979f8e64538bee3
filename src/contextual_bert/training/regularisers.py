"""What training hides from the model so that it learns what evaluation needs: history articles left out
(train.history_dropout) and article ids read as [UNK] (variants.<model>_attrs.id_dropout)."""

from __future__ import annotations

import torch

from contextual_bert.data.feature_spec import N_SPECIAL, PAD_INDEX, EncodedOutfits

def drop_history(history: torch.Tensor, rate: float, generator: torch.Generator) -> torch.Tensor:
    """train.history_dropout: each history article of the batch left out (PAD) with probability `rate`."""
    keep = torch.rand(history.shape, generator=generator, device=history.device) >= rate
    return torch.where(keep, history, torch.full_like(history, PAD_INDEX))


ID_DROPOUT_FLOOR = 0.05  # "auto"'s least rate: [UNK] is trained as input and target (articles added after training)


def id_dropout_rate(setting: float | str, model, val_data: EncodedOutfits) -> float:
    """The id dropout an "_attrs" model trains with: `setting` (variants.<model>_attrs.id_dropout), or for "auto"
    the share of the validation outfits' articles that have no id embedding (catalogue index >= n_ids: unseen in
    training), at least ID_DROPOUT_FLOOR. Why: id dropout is there so that training meets [UNK] + attributes as
    evaluation does; where it meets none, dropping ids only hides what the ids carry (on planted data with
    hidden tastes, everything the attributes do not say; docs/encoder_recipe.md)."""
    if setting != "auto":
        return float(setting)
    real = val_data.items >= N_SPECIAL
    unseen = real & (val_data.items >= model.n_ids)
    return max(ID_DROPOUT_FLOOR, int(unseen.sum()) / max(1, int(real.sum())))
