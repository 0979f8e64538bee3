"""c: the customer context vector, one embedding per context feature, and the history's share of it."""

from __future__ import annotations

import torch
from torch import nn

from contextual_bert.config import ModelConfig
from contextual_bert.data.feature_spec import HISTORY_FEATURE, PAD_INDEX, ContextSpec, FeatureSpec
from contextual_bert.errors import ContextualBertError


class HistoryPooling(nn.Module):
    """The customer's history's share of c (model.history_pooling "mean"): the mean of its articles' vectors,
    read from the model's own article table (with attributes for the "_attrs" models, so an article without an
    id still says what it is), projected to the feature's dim. Zeros in, the bias out, when there is no
    history. Blind to the order by construction: a history is a set of what was worn before."""

    def __init__(self, d_model: int, dim: int):
        super().__init__()
        self.projection = nn.Linear(d_model, dim)

    def forward(self, history: torch.Tensor, article_vectors) -> torch.Tensor:
        return self.projection(history_mean(history, article_vectors))


def history_mean(history: torch.Tensor, article_vectors) -> torch.Tensor:
    """(..., d) the mean of a 0-padded history's article vectors (`article_vectors`: indices -> (..., d));
    zeros for an empty one."""
    seen = (history != PAD_INDEX).unsqueeze(-1)
    vectors = article_vectors(history) * seen
    return vectors.sum(dim=-2) / seen.sum(dim=-2).clamp_min(1).to(vectors.dtype)


class HistoryAttentionPooling(HistoryPooling):
    """The history pooled by attention with a learned query (model.history_pooling "attention"): per head h, a
    softmax of u_h . v_i over the history's article vectors v_i and a learned null slot of value 0; the heads'
    weighted sums are concatenated and projected to the feature's dim. Why the null slot: a mean says what a
    customer's articles are like on average, and as much after 2 articles as after 50, where the evidence
    about a taste grows with every article; with the null slot the weight on the history grows with the
    articles that match a head's query, and an empty history gives zeros (the bias out), as the mean does.
    Starts as the mean, times n / (n + 1). No positions: blind to the order, like the mean."""

    def __init__(self, d_model: int, dim: int, n_heads: int):
        super().__init__(d_model * n_heads, dim)
        self.query = nn.Parameter(torch.zeros(n_heads, d_model))  # u_h
        self.null_logit = nn.Parameter(torch.zeros(n_heads))

    def forward(self, history: torch.Tensor, article_vectors) -> torch.Tensor:
        seen = (history != PAD_INDEX).unsqueeze(-1)
        vectors = article_vectors(history) * seen  # (..., n, d)
        scores = (vectors @ self.query.t() * vectors.shape[-1] ** -0.5).masked_fill(~seen, float("-inf"))
        null = self.null_logit.expand(*scores.shape[:-2], 1, -1)
        weights = torch.softmax(torch.cat([null, scores], dim=-2), dim=-2)[..., 1:, :]  # (..., n, heads)
        pooled = weights.transpose(-1, -2) @ vectors  # (..., heads, d)
        return self.projection(pooled.flatten(-2))


class ContextEmbedding(nn.Module):
    """c: one trainable embedding per context feature, concatenated in the spec's order.

    Categorical and bucketized numeric features are one index each. A multi-categorical feature is a
    0-padded row of indices and contributes the mean of its non-padding embeddings (zeros when empty). The
    history (features.history) is a 0-padded row of article indices, pooled (model.history_pooling: HistoryPooling
    or HistoryAttentionPooling) from the model's article vectors (`article_vectors`: indices -> (..., d_model)).
    """

    def __init__(self, spec: ContextSpec, model_cfg: ModelConfig | None = None):
        super().__init__()
        self.spec = spec
        self.embeddings = nn.ModuleList(self._embedding(f, model_cfg) for f in spec.features)

    @staticmethod
    def _embedding(feature: FeatureSpec, model_cfg: ModelConfig | None) -> nn.Module:
        if feature.kind == "history":
            if model_cfg is None:
                raise ContextualBertError("the history feature needs the model's article vectors (d_model)")
            if model_cfg.history_pooling == "attention":
                return HistoryAttentionPooling(model_cfg.d_model, feature.dim, model_cfg.n_heads)
            return HistoryPooling(model_cfg.d_model, feature.dim)
        if feature.kind == "multi_categorical":
            return nn.EmbeddingBag(feature.cardinality, feature.dim, mode="mean", padding_idx=PAD_INDEX)
        return nn.Embedding(feature.cardinality, feature.dim, padding_idx=PAD_INDEX)

    @property
    def d_context(self) -> int:
        return self.spec.d_context

    @property
    def names(self) -> set[str]:
        return {f.name for f in self.spec.features}

    @property
    def reads_history(self) -> bool:
        return HISTORY_FEATURE in self.names

    def forward(self, context: dict[str, torch.Tensor], article_vectors=None) -> torch.Tensor:
        parts = []
        for feature, embedding in zip(self.spec.features, self.embeddings):
            if feature.name not in context:
                raise ContextualBertError(f"context feature '{feature.name}' is missing from the input")
            if feature.kind == "history":
                parts.append(embedding(context[feature.name], article_vectors))
            else:
                parts.append(embedding(context[feature.name]))
        return torch.cat(parts, dim=-1)
