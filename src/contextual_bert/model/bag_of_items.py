"""The learned bag of items: the yardstick a transformer must beat to have earned its parameters."""

from __future__ import annotations

import torch
from torch import nn

from contextual_bert.config import BASELINE_MODELS, ModelConfig, base_model
from contextual_bert.data.feature_spec import PAD_INDEX, ContextSpec
from contextual_bert.errors import ContextualBertError
from contextual_bert.model.articles import ArticleAttributes
from contextual_bert.model.context import ContextEmbedding
from contextual_bert.model.dropout import Dropout
from contextual_bert.model.head import ArticleHead, ArticleVectors
from contextual_bert.model.readers import other_articles_mean
from contextual_bert.model.scores import OutfitModel


class BagOfItems(OutfitModel):
    """A learned baseline beside popularity (item2vec / CBOW): the article at a position is scored from the
    mean of the other articles' embeddings (plus W_c c in the context version), dotted with output
    embeddings of its own. No attention and no interaction between articles: what co-occurrence alone (and
    c) explains. Same interface as ContextualBert, so the same training, early stopping and evaluation run
    it; a transformer that does not beat it has not earned its parameters.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        name: str,
        n_items: int,
        spec: ContextSpec,
        attributes: ContextSpec | None = None,
        combine: str = "sum",
    ):
        super().__init__()
        if base_model(name) not in BASELINE_MODELS:
            raise ContextualBertError(f"unknown baseline '{name}' (one of {', '.join(BASELINE_MODELS)})")
        self.model_cfg, self.name, self.spec = model_cfg, name, spec
        d = model_cfg.d_model
        uses_context = base_model(name) == "bag_of_items_context"
        if uses_context and spec.d_context == 0:
            raise ContextualBertError(f"'{name}' needs context features; the spec has none")
        self.item_embeddings = nn.Embedding(n_items, d, padding_idx=PAD_INDEX)
        self.output_embeddings = nn.Embedding(n_items, d)
        self.output_bias = nn.Parameter(torch.zeros(n_items))
        self.context_embedding = ContextEmbedding(spec, model_cfg) if uses_context else None
        self.context_projection = nn.Linear(spec.d_context, d) if uses_context else None
        self.dropout = Dropout(model_cfg.dropout)
        for table in (self.item_embeddings, self.output_embeddings):
            nn.init.normal_(table.weight, std=d**-0.5)  # small first logits, as in ContextualBert
        self._init_attributes(name, n_items, attributes, combine)
        # the untied output side has attribute embeddings of its own, reading the same catalogue
        self.output_attributes = (ArticleAttributes(self.attributes.spec, n_items, d, combine)
                                  if self.attributes is not None else None)  # fmt: skip
        self.articles = ArticleVectors(self.item_embeddings, self.attributes)
        self.output = ArticleHead(ArticleVectors(self.output_embeddings, self.output_attributes), self.output_bias)

    def forward(self, items: torch.Tensor, context: dict | None = None, select: torch.Tensor | None = None):
        """(B, L, d): at every position, the mean embedding of the outfit's other articles ([MASK] and
        padding left out), plus W_c c; (M, d) at the `select` positions only."""
        h = other_articles_mean(self.article_vectors(items), items)
        if self.context_embedding is not None and self.context_projection is not None:  # the context version
            c = self.context_embedding(context, self.article_vectors)
            h = h + self.context_projection(c).unsqueeze(1)
        h = self.dropout(h)
        return h if select is None else h[select]

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden
