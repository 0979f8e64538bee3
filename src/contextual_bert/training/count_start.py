"""The count as a model's starting point (train.init_output: counts): the output bias starts at the training
split's log-popularity, so that a model starts at about the popularity yardstick (with a history, at about
popularity + own history: model.readers.HistoryRepeat) and its learned scores, small and random at the start as
before, add to it. Why: on sparse data a model started at a zero bias memorises the articles seen once or twice
before it has learned the counts, and ends below them (docs/training.md, "Sparse data").

An "_attrs" model starts at its own yardstick, the attribute-aware popularity (evaluate.popularity_attribute),
where the catalogue has that attribute: a fixed log P(a) per catalogue row (ArticleAttributes.set_count_prior),
the bias left at 0. An article without an id has no bias row of its own (it shares [UNK]'s), so only a prior per
row gives it the count's mass for its value; and an article whose id is dropped in training keeps its count."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from contextual_bert.data.feature_spec import N_SPECIAL, UNKNOWN_INDEX

if TYPE_CHECKING:
    from contextual_bert.evaluation.counts import AttributePopularityModel
    from contextual_bert.model import BagOfItems, ContextualBert


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
def start_from_counts(
    model: ContextualBert | BagOfItems, items: torch.Tensor, attribute_count: AttributePopularityModel | None = None
) -> str:
    """Start `model` at its count; which one it was: "popularity", `model`'s output bias set to `log_popularity`
    of the training outfits `items`; or, for an "_attrs" model given `attribute_count` (the attribute-aware
    popularity over its catalogue), "popularity_attribute", the count's log P(a) as every catalogue row's prior.
    Only the bias or prior: with the learned scores started at zero too (the head transform zeroed) the encoder of
    the default data stayed at popularity (outfit dependence 0.001 after 6 epochs against 0.97; docs/decisions.md)."""
    if attribute_count is not None and model.attributes is not None:
        log_prior = attribute_count.log_prior()[: model.n_ids]
        assert attribute_count.attribute is not None, "a count prior names its attribute"
        for side in model.article_sides():
            side.set_count_prior(
                attribute_count.attribute, log_prior, attribute_count.log_unseen_value, attribute_count.unseen_share
            )
        return "popularity_attribute"
    model.output_bias.copy_(log_popularity(items, model.output_bias.shape[0]).to(model.output_bias.dtype))
    return "popularity"
