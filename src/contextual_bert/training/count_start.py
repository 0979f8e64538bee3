"""The count as a model's starting point (train.init_output: counts): the output bias starts at the training
split's log-popularity, so that a model starts at about the popularity yardstick (with a history, at about
popularity + own history: model.readers.HistoryRepeat) and its learned scores, small and random at the start as
before, add to it. Why: on sparse data a model started at a zero bias memorises the articles seen once or twice
before it has learned the counts, and ends below them (docs/training.md, "Sparse data")."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from contextual_bert.data.feature_spec import N_SPECIAL, UNKNOWN_INDEX

if TYPE_CHECKING:
    from contextual_bert.model import OutfitModel


def log_popularity(items: torch.Tensor, n_ids: int) -> torch.Tensor:
    """(n_ids,) log((count + 1) / sum) of every real article id over the training outfits `items` (catalogue or
    id indices; only ids below n_ids are counted), the popularity yardstick's softmax; [UNK] as a count of 0
    (an article without an id: an "_attrs" model's bias row for it); 0 at the other special rows."""
    real = items[(items >= N_SPECIAL) & (items < n_ids)]
    counts = torch.bincount(real, minlength=n_ids).double() + 1.0
    counts[:N_SPECIAL] = 0.0
    log_p = (counts / counts.sum()).log()
    log_p[:N_SPECIAL] = 0.0
    log_p[UNKNOWN_INDEX] = -counts.sum().log()
    return log_p


@torch.no_grad()
def start_from_counts(model: OutfitModel, items: torch.Tensor) -> None:
    """Set `model`'s output bias to `log_popularity` of the training outfits `items`. Only the bias: with the
    learned scores started at zero too (the head transform zeroed) the encoder of the default data stayed at
    popularity (outfit dependence 0.001 after 6 epochs against 0.97; docs/decisions.md)."""
    bias = model.output.bias
    bias.copy_(log_popularity(items, bias.shape[0]).to(bias.dtype))
