"""The output side every model shares: article vectors (ids, or ids and attributes), the head state with its
terms, logits over the real articles with their offsets, and the logits at the one [MASK] of every row."""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from contextual_bert.config import uses_attributes
from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, ContextSpec
from contextual_bert.errors import ContextualBertError
from contextual_bert.model.articles import ArticleAttributes
from contextual_bert.model.readers import CatalogueOffsets, LogitOffset, add_offsets, head_terms, logit_offsets


class ArticleScores:
    """The output side shared by the models: logits over the real articles from head states, and the
    logits at the one [MASK] of every row. Needs `forward`, `head` and `output_layer`.

    With article attributes (`attributes` not None) the articles are those of the catalogue, n_items of
    them, of which the first n_ids have an id embedding: `article_vectors` and the per-id bias come from
    `ArticleAttributes`, and `set_catalogue` changes which articles are scored without touching a weight.

    A pass that scores the whole catalogue many times (validation, evaluation, FITB, serving) holds the
    output layer built once (`catalogue_pass`, `hold_catalogue`): for the "_attrs" models, the article
    vectors of every catalogue article and their bias, which each call would otherwise build again. Eval
    mode and no gradient only: in training the output layer is built every step (its id dropout draws)."""

    def _init_articles(self, variant: str, n_items: int, attributes: ContextSpec | None, combine: str) -> None:
        """n_ids (article id rows), for a "<model>_attrs" variant the attribute embeddings, and the readers at the
        two seams (readers.py): the terms added to the head state and the offsets added to the logits."""
        self.n_ids = n_items
        self.attributes = None  # (no class attributes: they would hide the submodules)
        if uses_attributes(variant) != (attributes is not None and len(attributes.features) > 0):
            raise ContextualBertError(
                f"model '{variant}' "
                + (
                    "needs article attributes (features.article_features: true)"
                    if uses_attributes(variant)
                    else "reads article ids only; it takes no attributes"
                )
            )
        if attributes is not None:
            self.attributes = ArticleAttributes(attributes, n_items, self.model_cfg.d_model, combine)
        self.head_terms = head_terms(self.model_cfg, encoder=hasattr(self, "blocks"), reads_history=self.reads_history)
        self.logit_offsets = logit_offsets(self.model_cfg, attributes, self.reads_history)
        self._held_output = None  # hold_catalogue's (weight, bias): not a weight, not in the state_dict

    def reader(self, kind: type) -> nn.Module | None:
        """The model's reader of class `kind` at either seam, or None."""
        return next((m for m in (*self.head_terms, *self.logit_offsets) if isinstance(m, kind)), None)

    @property
    def reads_history(self) -> bool:
        """Whether c holds the customer's history (features.history), which the history readers need."""
        return self.context_embedding is not None and self.context_embedding.reads_history

    @property
    def n_items(self) -> int:
        """Articles scored: the catalogue's with attributes, else the id vocabulary's (specials included)."""
        return self.n_ids if self.attributes is None else self.attributes.n_items

    def set_catalogue(self, attributes: dict[str, torch.Tensor]) -> None:
        if self.attributes is None:
            raise ContextualBertError(f"model '{self.variant}' reads article ids only; it has no catalogue")
        self.release_catalogue()
        self.attributes.set_catalogue(attributes)

    # --- the output layer held for a pass over many batches ---------------------------------------------

    def hold_catalogue(self) -> bool:
        """Build the output layer over the whole catalogue now (`output_layer()`: for the "_attrs" models every
        article's vector from its id and attributes, and its bias) and score every later call without gradient
        in eval mode with it, until `release_catalogue`. Nothing in training mode (the output layer's id
        dropout draws anew every step). Returns whether it built one (False: one was held already, or
        training mode). The weights must not change while it is held (a pass, a served model)."""
        if self.training or self._held_output is not None:
            return False
        with torch.no_grad():
            weight, bias = self.output_layer()
        self._held_output = (weight.detach(), bias.detach())
        return True

    def release_catalogue(self) -> None:
        self._held_output = None

    @contextmanager
    def catalogue_pass(self):
        """The body as one pass over the catalogue: the output layer built once (`hold_catalogue`), released
        after; within an enclosing pass, that one's."""
        built = self.hold_catalogue()
        try:
            yield self
        finally:
            if built:
                self.release_catalogue()

    def catalogue_output(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight (n_items, d), bias (n_items,)) of the output layer over every article: the held one when a
        pass holds it (eval mode, no gradient), else `output_layer()`. The same tensors either way."""
        if self._held_output is not None and not self.training and not torch.is_grad_enabled():
            return self._held_output
        return self.output_layer()

    def article_vectors(self, table: nn.Embedding, articles: torch.Tensor | None = None) -> torch.Tensor:
        """The vectors of `articles` (any shape) or of every article, from the id table `table` and, with
        attributes, the articles' attribute embeddings. Within a pass that holds the output layer, read from it
        where it holds these very vectors (the output tied to the input's articles, as ContextualBert's; the
        attributes summed, each row on its own: the same numbers), not built again for every outfit and
        history article."""
        held = self._held_output
        if (
            held is not None
            and articles is not None
            and table is self.item_embeddings
            and not self.training
            and not torch.is_grad_enabled()
            and not hasattr(self, "output_embeddings")
            and (self.attributes is None or self.attributes.combine == "sum")
        ):
            return held[0][articles]
        if self.attributes is not None:
            return self.attributes(table, articles)
        return table.weight if articles is None else table(articles)

    def set_id_dropout(self, rate: float, unseen_share: float | None = None) -> None:
        """Id dropout for training (variants.<model>_attrs.id_dropout; ArticleAttributes.ids), on both article sides;
        and the offset of the articles without an id outside training, for `unseen_share` of the targets without
        one (ArticleAttributes.calibrate_unseen; None: the rate's own share, as `auto` sets it)."""
        if self.attributes is None:
            raise ContextualBertError(f"model '{self.variant}' reads article ids only; it has no id dropout")
        for side in self.article_sides():
            side.id_dropout = float(rate)
            side.calibrate_unseen(float(rate) if unseen_share is None else unseen_share)

    def article_sides(self) -> list[ArticleAttributes]:
        """The model's article attributes: the input's, and the output layer's where it has its own (the bag of items)."""
        return [side for side in (self.attributes, getattr(self, "output_attributes", None)) if side is not None]

    def set_unseen_offset(self, offset: float) -> None:
        """The calibration offset of the articles without an id on every article side (ArticleAttributes.calibrate_unseen
        sets it in training; a checkpoint restores it)."""
        for side in self.article_sides():
            side.unseen_offset = float(offset)

    def output_articles(
        self, table: nn.Embedding, attributes: ArticleAttributes | None, articles: torch.Tensor | None = None
    ):
        """(weight (n_items, d), bias (n_items,)) of the output layer over every article, from the id table
        `table` and, with attributes, the attribute embeddings `attributes`; or (C, d), (C,) for the catalogue
        indices `articles` (C,) only: the sampled softmax's candidates, whose attribute vectors are then the
        only ones built. An article without an id (or whose id is dropped in this step) shares the [UNK] row's
        bias: one draw of `ids()` serves both; outside training an article without an id gets the calibration
        offset too (ArticleAttributes.calibrate_unseen)."""
        if attributes is None:
            if articles is None:
                return table.weight, self.output_bias
            return table.weight.index_select(0, articles), self.output_bias.index_select(0, articles)
        ids = attributes.ids(articles)
        return attributes(table, articles, ids=ids), attributes.bias(self.output_bias, ids, articles)

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
        total = None
        offsets: list[LogitOffset] = list(self.logit_offsets)  # type: ignore[arg-type]  # an nn.ModuleList of them
        for offset in offsets:
            if total is not None and articles is None and not torch.is_grad_enabled():
                total = offset.add_to(self, total, items, select, context)
            elif (part := offset(self, items, select, context, articles)) is not None:
                total = part if total is None else total + part
        return total.dense() if isinstance(total, CatalogueOffsets) and not blocks else total

    def article_logits(self, head_states: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        """(M, n_items - N_SPECIAL) logits over the real articles (specials are never predicted); `offsets`
        from `outfit_offsets` at the same positions."""
        weight, bias = self.catalogue_output()
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
        weight, bias = self.catalogue_output()
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
        weight, bias = self.catalogue_output()
        logits = F.linear(head_states, weight.to(head_states.dtype), bias.to(head_states.dtype))
        if offsets is None:
            offsets = self.outfit_offsets(items, is_mask, context=context, blocks=True)
        if isinstance(offsets, CatalogueOffsets):
            logits = offsets.add_to(logits)
        elif offsets is not None:
            logits = add_offsets(logits, offsets.to(logits.dtype))
        return logits.index_fill_(1, torch.arange(N_SPECIAL, device=logits.device), float("-inf"))
