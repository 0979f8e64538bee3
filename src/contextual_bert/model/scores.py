"""The output side every model shares: article vectors (ids, or ids and attributes), the head state with its
terms, logits over the real articles with their offsets, and the logits at the one [MASK] of every row."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from contextual_bert.config import uses_attributes
from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, ContextSpec
from contextual_bert.errors import ContextualBertError
from contextual_bert.model.articles import ArticleAttributes
from contextual_bert.model.readers import head_terms, logit_offsets


class ArticleScores:
    """The output side shared by the models: logits over the real articles from head states, and the
    logits at the one [MASK] of every row. Needs `forward`, `head` and `output_layer`.

    With article attributes (`attributes` not None) the articles are those of the catalogue, n_items of
    them, of which the first n_ids have an id embedding: `article_vectors` and the per-id bias come from
    `ArticleAttributes`, and `set_catalogue` changes which articles are scored without touching a weight."""

    def _init_articles(self, variant: str, n_items: int, attributes: ContextSpec | None, combine: str) -> None:
        """n_ids (article id rows), for a "<model>_attrs" variant the attribute embeddings, and the readers at the
        two seams (readers.py): the terms added to the head state and the offsets added to the logits."""
        self.n_ids = n_items
        self.attributes = None  # (no class attributes: they would hide the submodules)
        if uses_attributes(variant) != (attributes is not None and len(attributes.features) > 0):
            raise ContextualBertError(
                f"model '{variant}' " + ("needs article attributes (features.article_features: true)"
                                         if uses_attributes(variant) else "reads article ids only; it takes no attributes"))
        if attributes is not None:
            self.attributes = ArticleAttributes(attributes, n_items, self.model_cfg.d_model, combine)
        self.head_terms = head_terms(self.model_cfg, encoder=hasattr(self, "blocks"), reads_history=self.reads_history)
        self.logit_offsets = logit_offsets(self.model_cfg, attributes, self.reads_history)

    def reader(self, kind: type) -> nn.Module | None:
        """The model's reader of class `kind` at either seam, or None."""
        return next((m for m in (*self.head_terms, *self.logit_offsets) if isinstance(m, kind)), None)

    @property
    def reads_history(self) -> bool:
        """Whether c holds the customer's history (features.history), which the history readers need."""
        return self.context_encoder is not None and self.context_encoder.reads_history

    @property
    def n_items(self) -> int:
        """Articles scored: the catalogue's with attributes, else the id vocabulary's (specials included)."""
        return self.n_ids if self.attributes is None else self.attributes.n_items

    def set_catalogue(self, attributes: dict[str, torch.Tensor]) -> None:
        if self.attributes is None:
            raise ContextualBertError(f"model '{self.variant}' reads article ids only; it has no catalogue")
        self.attributes.set_catalogue(attributes)

    def article_vectors(self, table: nn.Embedding, articles: torch.Tensor | None = None) -> torch.Tensor:
        """The vectors of `articles` (any shape) or of every article, from the id table `table` and, with
        attributes, the articles' attribute embeddings."""
        if self.attributes is not None:
            return self.attributes(table, articles)
        return table.weight if articles is None else table(articles)

    def set_id_dropout(self, rate: float) -> None:
        """Id dropout for training (variants.<model>_attrs.id_dropout; ArticleAttributes.ids), on both article sides."""
        if self.attributes is None:
            raise ContextualBertError(f"model '{self.variant}' reads article ids only; it has no id dropout")
        for side in (self.attributes, getattr(self, "output_attributes", None)):
            if side is not None:
                side.id_dropout = float(rate)

    def output_articles(self, table: nn.Embedding, attributes: "ArticleAttributes | None",
                        articles: torch.Tensor | None = None):
        """(weight (n_items, d), bias (n_items,)) of the output layer over every article, from the id table
        `table` and, with attributes, the attribute embeddings `attributes`; or (C, d), (C,) for the catalogue
        indices `articles` (C,) only: the sampled softmax's candidates, whose attribute vectors are then the
        only ones built. An article without an id (or whose id is dropped in this step) shares the [UNK] row's
        bias: one draw of `ids()` serves both."""
        if attributes is None:
            if articles is None:
                return table.weight, self.output_bias
            return table.weight.index_select(0, articles), self.output_bias.index_select(0, articles)
        ids = attributes.ids(articles)
        return attributes(table, articles, ids=ids), self.output_bias[ids]

    def outfit_offsets(self, items: torch.Tensor, select: torch.Tensor, articles: torch.Tensor | None = None,
                       context: dict[str, torch.Tensor] | None = None) -> torch.Tensor | None:
        """(M, n_items) the sum of the logit offsets (readers.logit_offsets) at the `select` positions, or (M, C)
        for the catalogue indices `articles` only; None for a model without them. The history's need the
        `context`."""
        parts = [part for offset in self.logit_offsets
                 if (part := offset(self, items, select, context, articles)) is not None]
        return sum(parts[1:], parts[0]) if parts else None

    def article_logits(self, head_states: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        """(M, n_items - N_SPECIAL) logits over the real articles (specials are never predicted); `offsets`
        from `outfit_offsets` at the same positions."""
        weight, bias = self.output_layer()
        logits = F.linear(head_states, weight[N_SPECIAL:].to(head_states.dtype), bias[N_SPECIAL:].to(head_states.dtype))
        return logits if offsets is None else logits + offsets[:, N_SPECIAL:].to(logits.dtype)

    def head_states(self, items: torch.Tensor, context: dict | None, select: torch.Tensor) -> torch.Tensor:
        """(M, d) the states the output layer scores at the `select` positions (bool, (B, L)): the head of the
        encoder's states, plus each head term (readers.head_terms)."""
        states = self.head(self.forward(items, context, select=select))
        for term in self.head_terms:
            states = term(self, states, items, context, select)
        return states

    def masked_logits(self, items: torch.Tensor, context: dict[str, torch.Tensor] | None) -> torch.Tensor:
        """(B, n_items) logits at the one MASK_INDEX of every row; the special indices get -inf."""
        is_mask = items == MASK_INDEX
        if not bool((is_mask.sum(dim=1) == 1).all()):
            raise ContextualBertError("masked_logits needs exactly one [MASK] item in every row")
        head_states = self.head_states(items, context, is_mask)
        weight, bias = self.output_layer()
        logits = F.linear(head_states, weight.to(head_states.dtype), bias.to(head_states.dtype))
        offsets = self.outfit_offsets(items, is_mask, context=context)
        if offsets is not None:
            logits = logits + offsets.to(logits.dtype)
        return logits.index_fill_(1, torch.arange(N_SPECIAL, device=logits.device), float("-inf"))
