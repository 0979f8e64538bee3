"""The scoring every model shares, around its article head (head.py): the head state with its terms, logits over
the real articles with their offsets, and the logits at the one [MASK] of every row."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from contextual_bert.config import ModelConfig, uses_attributes
from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, ContextSpec
from contextual_bert.errors import ContextualBertError
from contextual_bert.model.articles import ArticleAttributes
from contextual_bert.model.context import ContextEmbedding
from contextual_bert.model.head import ArticleHead, ArticleVectors, OutputLayer
from contextual_bert.model.readers import CatalogueOffsets, LogitOffset, add_offsets, dense, head_terms, logit_offsets

Reader = TypeVar("Reader", bound=nn.Module)


class OutfitModel(nn.Module):
    """A model of outfits: an encoder of the articles at the positions to predict (`forward`, then `head`), its
    input's article vectors (`articles`) and its article head (`output`), and the readers at the two seams
    (readers.py): terms added to the head state, offsets added to the logits. ContextualBert and BagOfItems are
    two; what they share is here, and what each has it declares.

    With article attributes (`attributes` not None) the articles are those of the catalogue, n_items of them, of
    which the first n_ids have an id embedding; `set_catalogue` changes which articles are scored without touching a
    weight."""

    model_cfg: ModelConfig
    name: str  # the model's name (MODELS): an encoder's conditioning variant or a bag, "_attrs" or not
    spec: ContextSpec
    context_embedding: ContextEmbedding | None
    attributes: ArticleAttributes | None
    head_terms: nn.ModuleList
    logit_offsets: nn.ModuleList
    articles: ArticleVectors  # the input's
    output: ArticleHead

    def forward(
        self, items: torch.Tensor, context: dict[str, torch.Tensor] | None = None, select: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Hidden states (B, L, d) at the positions of `items` (B, L), or (M, d) at the `select` ones."""
        raise NotImplementedError

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head state from the encoder's hidden states at the positions to predict."""
        raise NotImplementedError

    def _init_attributes(self, name: str, n_items: int, attributes: ContextSpec | None, combine: str) -> None:
        """For a "<model>_attrs" model the attribute embeddings of the input's articles (else None), and the
        readers at the two seams (readers.py): the terms added to the head state and the offsets added to the
        logits. Called where the paper's models draw them (their initial weights stay as they were)."""
        self.attributes = None  # (no class attributes: they would hide the submodules)
        if uses_attributes(name) != (attributes is not None and len(attributes.features) > 0):
            raise ContextualBertError(
                f"model '{name}' "
                + (
                    "needs article attributes (features.article_features: true)"
                    if uses_attributes(name)
                    else "reads article ids only; it takes no attributes"
                )
            )
        if attributes is not None:
            self.attributes = ArticleAttributes(attributes, n_items, self.model_cfg.d_model, combine)
        self.head_terms = head_terms(self.model_cfg, encoder=hasattr(self, "blocks"), reads_history=self.reads_history)
        self.logit_offsets = logit_offsets(self.model_cfg, attributes, self.reads_history)

    def reader(self, kind: type[Reader]) -> Reader | None:
        """The model's reader of class `kind` at either seam, or None."""
        return next((m for m in (*self.head_terms, *self.logit_offsets) if isinstance(m, kind)), None)

    @property
    def reads_history(self) -> bool:
        """Whether c holds the customer's history (features.history), which the history readers need."""
        return self.context_embedding is not None and self.context_embedding.reads_history

    @property
    def n_ids(self) -> int:
        """Article id rows (specials included)."""
        return self.articles.n_ids

    @property
    def n_items(self) -> int:
        """Articles scored: the catalogue's with attributes, else the id vocabulary's (specials included)."""
        return self.articles.n_items

    def article_sides(self) -> list[ArticleAttributes]:
        """The model's article attributes: the input's, and the output layer's where it has its own (the bag of
        items)."""
        sides = [self.attributes, self.output.vectors.attributes]
        return [side for i, side in enumerate(sides) if side is not None and side not in sides[:i]]

    def set_catalogue(self, attributes: dict[str, torch.Tensor]) -> None:
        if self.attributes is None:
            raise ContextualBertError(f"model '{self.name}' reads article ids only; it has no catalogue")
        self.output.release()
        for side in self.article_sides():
            side.set_catalogue(attributes)

    def set_id_dropout(self, rate: float, unseen_share: float | None = None) -> None:
        """Id dropout for training (per_model.<model>_attrs.id_dropout; ArticleAttributes.ids), on both article sides;
        and the offset of the articles without an id outside training, for `unseen_share` of the targets without
        one (ArticleAttributes.calibrate_unseen; None: the rate's own share, as `auto` sets it)."""
        if self.attributes is None:
            raise ContextualBertError(f"model '{self.name}' reads article ids only; it has no id dropout")
        for side in self.article_sides():
            side.id_dropout = float(rate)
            side.calibrate_unseen(float(rate) if unseen_share is None else unseen_share)

    def set_unseen_offset(self, offset: float) -> None:
        """The calibration offset of the articles without an id on every article side (ArticleAttributes.calibrate_unseen
        sets it in training; a checkpoint restores it)."""
        for side in self.article_sides():
            side.unseen_offset = float(offset)

    def article_vectors(self, articles: torch.Tensor) -> torch.Tensor:
        """The input's vectors of `articles` (any shape); within a pass holding a tied output layer, read from it."""
        held = self.output.held_vectors(self.articles, articles)
        return self.articles(articles) if held is None else held

    def output_layer(self, articles: torch.Tensor | None = None) -> OutputLayer:
        """(weight, bias) of the output layer over every article, or the catalogue indices `articles` only
        (ArticleHead.layer)."""
        return self.output.layer(articles)

    def hold_catalogue(self) -> bool:
        """The output layer built once for the passes that follow (ArticleHead.hold), until `release_catalogue`."""
        return self.output.hold()

    def release_catalogue(self) -> None:
        self.output.release()

    @contextmanager
    def catalogue_pass(self) -> Iterator[OutfitModel]:
        """The body as one pass over the catalogue (ArticleHead.catalogue_pass)."""
        with self.output.catalogue_pass():
            yield self

    def outfit_offsets(
        self,
        items: torch.Tensor,
        select: torch.Tensor,
        articles: torch.Tensor | None = None,
        context: dict[str, torch.Tensor] | None = None,
        blocks: bool = False,
    ):
        """(M, n_items) the sum of the logit offsets (readers.logit_offsets) at the `select` positions, or (M, C)
        for the catalogue indices `articles` only; None for a model without them. The history's need the
        `context`. Over the whole catalogue without gradient, each offset after the first adds its own to the
        sum of those before it (`LogitOffset.add_to`: in place where it can, the same numbers: each element the
        same additions), and with `blocks` the attribute overlap's may come as a readers.CatalogueOffsets, for
        `masked_logits` to add block by block (never made whole)."""
        total: torch.Tensor | CatalogueOffsets | None = None
        offsets: list[LogitOffset] = list(self.logit_offsets)  # type: ignore[arg-type]  # an nn.ModuleList of them
        for offset in offsets:
            if total is not None and articles is None and not torch.is_grad_enabled():
                total = offset.add_to(self, total, items, select, context)
            elif (part := offset(self, items, select, context, articles)) is not None:
                total = part if total is None else dense(total) + dense(part)
        return total.dense() if isinstance(total, CatalogueOffsets) and not blocks else total

    def article_logits(self, head_states: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        """(M, n_items - N_SPECIAL) logits over the real articles (specials are never predicted); `offsets`
        from `outfit_offsets` at the same positions."""
        weight, bias = self.output.catalogue()
        logits = F.linear(head_states, weight[N_SPECIAL:].to(head_states.dtype), bias[N_SPECIAL:].to(head_states.dtype))
        return logits if offsets is None else logits + offsets[:, N_SPECIAL:].to(logits.dtype)

    def head_states(self, items: torch.Tensor, context: dict | None, select: torch.Tensor) -> torch.Tensor:
        """(M, d) the states the output layer scores at the `select` positions (bool, (B, L)): the head of the
        encoder's states, plus each head term (readers.head_terms)."""
        states = self.head(self.forward(items, context, select=select))
        for term in self.head_terms:
            states = term(self, states, items, select, context)
        return states

    def target_log_probs(
        self,
        items: torch.Tensor,
        context: dict[str, torch.Tensor] | None,
        targets: torch.Tensor,
        offsets: torch.Tensor | CatalogueOffsets | None = None,
        block: int = 1024,
    ) -> torch.Tensor:
        """(B, 1) log-probabilities of `targets` (B, 1) over the real articles at the one [MASK] of every row,
        with `offsets` as masked_logits takes them (None: none added), without gradient: the logits made and
        their log-sum-exp taken `block` articles at a time (kept in cache, never (B, n_items) at once; the sum
        in float64). The same as masked_logits then log_softmax over the real articles but for the order of
        the sum (within 1e-6): for a pass that needs the target's log-probability only (the outfit dependence's
        shuffled pass; at 105k articles and 256 rows 275 ms against 415 ms for the whole logits)."""
        is_mask = items == MASK_INDEX
        head_states = self.head_states(items, context, is_mask)
        weight, bias = self.output.catalogue()
        weight, bias = weight.to(head_states.dtype), bias.to(head_states.dtype)
        rows = torch.arange(len(targets), device=targets.device)
        peak = torch.full((len(targets),), float("-inf"), device=targets.device)
        total = torch.zeros(len(targets), dtype=torch.float64, device=targets.device)
        target_logit = torch.zeros(len(targets), device=targets.device)
        target = targets.reshape(-1)
        for start in range(N_SPECIAL, self.n_items, block):
            stop = min(start + block, self.n_items)
            logits = F.linear(head_states, weight[start:stop], bias[start:stop]).float()
            if isinstance(offsets, CatalogueOffsets):
                logits += offsets.columns(start, stop)
            elif offsets is not None:
                logits += offsets[:, start:stop].to(logits.dtype)
            inside = (target >= start) & (target < stop)
            target_logit[inside] = logits[rows[inside], target[inside] - start]
            peak_before, peak = peak, torch.maximum(peak, logits.amax(dim=1))
            shift = peak.masked_fill(torch.isneginf(peak), 0.0)  # a row of -inf so far: exp(-inf) = 0, not NaN
            total = total * torch.exp(peak_before - shift).double() + logits.sub_(shift[:, None]).exp_().sum(
                dim=1, dtype=torch.float64
            )
        return (target_logit.double() - peak.double() - total.log()).float()[:, None]

    def masked_logits(
        self,
        items: torch.Tensor,
        context: dict[str, torch.Tensor] | None,
        offsets: torch.Tensor | CatalogueOffsets | None = None,
    ) -> torch.Tensor:
        """(B, n_items) logits at the one MASK_INDEX of every row; the special indices get -inf. `offsets`:
        (B, n_items) logit offsets to add instead of the rows' own (`outfit_offsets` of `items`, a tensor or
        with blocks=True), e.g. those of the real outfits while the encoder reads others (the outfit dependence,
        evaluation.ranking)."""
        is_mask = items == MASK_INDEX
        if not bool((is_mask.sum(dim=1) == 1).all()):
            raise ContextualBertError("masked_logits needs exactly one [MASK] item in every row")
        head_states = self.head_states(items, context, is_mask)
        weight, bias = self.output.catalogue()
        logits = F.linear(head_states, weight.to(head_states.dtype), bias.to(head_states.dtype))
        if offsets is None:
            offsets = self.outfit_offsets(items, is_mask, context=context, blocks=True)
        if isinstance(offsets, CatalogueOffsets):
            logits = offsets.add_to(logits)
        elif offsets is not None:
            logits = add_offsets(logits, offsets.to(logits.dtype))
        return logits.index_fill_(1, torch.arange(N_SPECIAL, device=logits.device), float("-inf"))
