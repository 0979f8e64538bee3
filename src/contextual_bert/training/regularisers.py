"""What training hides from the model so that it learns what evaluation needs: history articles left out
(train.history_dropout), article ids read as [UNK] (per_model.<model>_attrs.id_dropout), and the id vectors of
articles seen once or twice decayed towards nothing (train.rare_id_decay)."""

from __future__ import annotations

import torch

from contextual_bert.data.feature_spec import N_SPECIAL, PAD_INDEX, EncodedOutfits


class RareIdDecay:
    """train.rare_id_decay = s: after every optimizer step, each article id's embedding row (the id tables:
    ContextualBert's tied one, a bag of items' input and output ones) shrinks by the factor 1 - lr * s / n^2, n
    its count in the training outfits (at least 1), on top of AdamW's decay (lr * weight_decay, the same for
    every row). Why: an article's id row is what its own outfits taught it; an article seen once has taught one
    outfit, which on sparse data the model learns by heart and then offers wherever a context resembles it (the
    closets study): the decay leaves such an article at its count (train.init_output: counts) and its history
    repeat. 1 / n^2, not 1 / n: the decay must be gone by the time an article is seen a handful of times, where
    dense data still learns from it (docs/decisions.md)."""

    def __init__(self, model, items: torch.Tensor, strength: float):
        self.tables = [
            t.weight
            for t in (getattr(model, "item_embeddings", None), getattr(model, "output_embeddings", None))
            if t is not None
        ]
        n_ids = self.tables[0].shape[0]
        real = items[(items >= N_SPECIAL) & (items < n_ids)]
        counts = torch.bincount(real, minlength=n_ids).clamp_min(1).to(self.tables[0].dtype)
        self.rate = (strength / counts**2)[:, None]
        self.rate[:N_SPECIAL] = 0.0  # padding, [MASK] and [UNK] are no article

    @torch.no_grad()
    def step(self, learning_rate: float) -> None:
        factor = (1.0 - learning_rate * self.rate).clamp_min(0.0)
        for weight in self.tables:
            weight.mul_(factor)


def drop_history(history: torch.Tensor, rate: float, generator: torch.Generator) -> torch.Tensor:
    """train.history_dropout: each history article of the batch left out (PAD) with probability `rate`."""
    keep = torch.rand(history.shape, generator=generator, device=history.device) >= rate
    return torch.where(keep, history, torch.full_like(history, PAD_INDEX))


def id_dropout_rate(setting: float | str, model, val_data: EncodedOutfits) -> float:
    """The id dropout an "_attrs" model trains with: `setting` (per_model.<model>_attrs.id_dropout), or for "auto"
    the share of the validation outfits' articles that have no id embedding (catalogue index >= n_ids: unseen in
    training), 0 where every one has an id. Why: id dropout is there so that training meets [UNK] + attributes as
    evaluation does; where it meets none, dropping ids only hides what the ids carry (docs/decisions.md). A
    never-dropped [UNK] row shrinks toward 0 under the weight decay, so an article added after training is read
    mostly by its attributes."""
    return unseen_share(model, val_data) if setting == "auto" else float(setting)


def unseen_share(model, val_data: EncodedOutfits) -> float:
    """The share of the validation outfits' articles that have no id embedding (catalogue index >= n_ids)."""
    real = val_data.items >= N_SPECIAL
    unseen = real & (val_data.items >= model.n_ids)
    return int(unseen.sum()) / max(1, int(real.sum()))
