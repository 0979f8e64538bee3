"""The readers: what a model reads beyond the paper's encoder, at two seams, each a list of small modules with
one signature (a Protocol each: `HeadTerm`, `LogitOffset`; the same order of arguments), built from ModelConfig
(`head_terms`, `logit_offsets`). A new reader is one class here and one setting in ModelConfig.

    head terms     term(model, states, items, select, context) -> states + the term   (M, d) head states
    logit offsets  offset(model, items, select, context, articles) -> (M, n | C) or None, added to the logits
                   offset.add_to(model, total, items, select, context) -> total + the offsets over the catalogue

Every reader but the history repeat starts at zero contribution (a zero weight or gate, or a weight of 0 outside
the warm-up), so a model with it starts exactly as without it; the history repeat starts as the popularity + own
history yardstick's mixture (HistoryRepeat), the count a model with a history starts from.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from contextual_bert.config import ModelConfig
from contextual_bert.data.feature_spec import (
    HISTORY_FEATURE,
    MASK_INDEX,
    N_SPECIAL,
    PAD_INDEX,
    UNKNOWN_INDEX,
    VECTOR_KIND,
    ContextSpec,
)
from contextual_bert.model.context import history_mean


def other_articles_mean(e: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """(B, L, d): at every position of `items` (B, L), the mean of `e` (B, L, d) over the outfit's other
    articles, [MASK] and padding left out (zeros where there is none). The bag of items' state, and
    ContextualBert's bag path (model.bag_path)."""
    seen = ((items != PAD_INDEX) & (items != MASK_INDEX)).unsqueeze(-1).to(e.dtype)
    e = e * seen
    n_others = (seen.sum(dim=1, keepdim=True) - seen).clamp_min(1.0)
    return (e.sum(dim=1, keepdim=True) - e) / n_others


class HeadTerm(Protocol):
    """A term added to the head state at the `select` positions (bool, (B, L)) of `items` (B, L)."""

    def __call__(
        self, model, states: torch.Tensor, items: torch.Tensor, select: torch.Tensor, context: dict | None
    ) -> torch.Tensor:
        """(M, d) `states` plus the term."""
        ...


class LogitOffset(Protocol):
    """An offset added to the logits at the `select` positions of `items`."""

    def __call__(
        self,
        model,
        items: torch.Tensor,
        select: torch.Tensor,
        context: dict | None = None,
        articles: torch.Tensor | None = None,
    ) -> torch.Tensor | CatalogueOffsets | None:
        """(M, n_items) offsets (without gradient over the whole catalogue, a CatalogueOffsets may stand for
        them), or (M, C) for the catalogue indices `articles` (C,) only; None where it reads nothing."""
        ...

    def add_to(
        self,
        model,
        total: torch.Tensor | CatalogueOffsets,
        items: torch.Tensor,
        select: torch.Tensor,
        context: dict | None = None,
    ) -> torch.Tensor | CatalogueOffsets:
        """`total` (the offsets before it, over the whole catalogue, without gradient) + these offsets: the
        same numbers as total + the call's, in place where it can."""
        ...


# --- terms added to the head state -------------------------------------------------------------------------


class OutfitBag(nn.Module):
    """h += w * the mean of the outfit's other articles' (tied) output vectors at the input's scale, so that
    h . e_a gets a tied bag of items' score. w = 1 always under model.bag_path "output" (the blocks then add what
    a bag cannot); else the bag warm-up's weight (training.warmup sets `warmup_weight`), in training mode only:
    every evaluation sees the paper's model. No parameter."""

    def __init__(self, always: bool):
        super().__init__()
        self.always = always
        self.warmup_weight = 0.0

    def forward(
        self, model, states: torch.Tensor, items: torch.Tensor, select: torch.Tensor, context: dict | None
    ) -> torch.Tensor:
        weight = 1.0 if self.always else (self.warmup_weight if self.training else 0.0)
        if weight <= 0:
            return states
        bag = other_articles_mean(model.article_vectors(items), items)[select]
        return states + weight * (bag * model.input_scale).to(states.dtype)


class HistoryBag(nn.Module):
    """h += g * the mean of the customer's history's (tied) output vectors at the input's scale
    (model.history_bag): scored against a candidate's vector, how like the customer's earlier articles it is,
    the way the bag of items scores it against the outfit's. g is learned from 0."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(()))

    def forward(
        self, model, states: torch.Tensor, items: torch.Tensor, select: torch.Tensor, context: dict | None
    ) -> torch.Tensor:
        assert context is not None, "HistoryBag is built only for a model that reads a history"
        rows = select.nonzero(as_tuple=True)[0]
        mean = history_mean(context[HISTORY_FEATURE][rows], model.article_vectors)
        return states + self.gate * (mean * model.input_scale).to(states.dtype)


# --- offsets added to the logits ---------------------------------------------------------------------------

ADD_BLOCK = 1024  # articles per block when offsets are added to the logits a block at a time (CPU)


def add_offsets(logits: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """logits + offsets, both (M, n). Offsets laid out article-major (a transposed view of (n, M), as
    CatalogueOffsets.dense makes them) are added in place on the CPU, ADD_BLOCK articles at a time: in one pass
    the add would stride through memory (at 105k articles and 256 rows: 190 ms in one pass, 50 ms in blocks;
    the logits' matrix product takes 110 ms). The same numbers either way: each element one addition."""
    article_major = offsets.dim() == 2 and offsets.stride(0) == 1 and offsets.stride(1) > 1
    if not article_major or logits.device.type != "cpu" or torch.is_grad_enabled():
        return logits + offsets
    for start in range(0, logits.shape[1], ADD_BLOCK):
        logits[:, start : start + ADD_BLOCK] += offsets[:, start : start + ADD_BLOCK]
    return logits


class CatalogueOffsets:
    """AttributeOverlap's offsets of M rows over every article of the catalogue, without gradient, kept as
    what they are made of: each row's gain per attribute value (`gains`, (values + 1, M)) and each article's
    values (`index`, (n, S) rows of `gains`; `pad` an empty slot, `weights` (n, S) or None: 1 / the article's
    values of that attribute). offset[m, a] = sum_s weights[a, s] gains[index[a, s], m]: an embedding_bag.
    Offsets of few articles per row may be added to them (`add_sparse`: the history repeat's).

    `add_to` adds them to (M, n) logits a block of ADD_BLOCK articles at a time on the CPU (each block's offsets
    made and added while in cache: at 105k articles and 256 rows, 75 ms against 155 ms for making the (n, M)
    offsets whole and adding them); `dense` makes them whole, laid out article-major."""

    def __init__(self, index: torch.Tensor, weights: torch.Tensor | None, pad: int, gains: torch.Tensor):
        self.index, self.weights, self.pad, self.gains = index, weights, pad, gains
        self.sparse: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def shape(self) -> tuple[int, int]:
        return self.gains.shape[1], self.index.shape[0]

    def add_sparse(self, articles: torch.Tensor, values: torch.Tensor) -> CatalogueOffsets:
        """These offsets + `values` (M, K) at the articles `articles` (M, K) of each row (an article once per
        row; a 0 value anywhere): the sum the history repeat's forward would make with a (M, n) tensor."""
        self.sparse.append((articles, values))
        return self

    def _block(self, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        """(articles start..stop, M) offsets, article-major."""
        weights = None if self.weights is None else self.weights[start:stop]
        block = F.embedding_bag(
            self.index[start:stop], self.gains, mode="sum", per_sample_weights=weights, padding_idx=self.pad
        )
        first = 0 if start is None else start
        for articles, values in self.sparse:  # block[a, m] + value, each an addition as total + forward() makes
            inside = (articles >= first) & (articles < first + block.shape[0])
            rows, slots = inside.nonzero(as_tuple=True)
            columns = articles[rows, slots] - first
            block[columns, rows] = block[columns, rows] + values[rows, slots].to(block.dtype)
        return block

    def dense(self) -> torch.Tensor:
        """(M, n) the offsets as a tensor, article-major (a transposed view of (n, M))."""
        return self._block().t()

    def columns(self, start: int, stop: int) -> torch.Tensor:
        """(M, stop - start) the offsets of the articles start..stop-1 (a transposed view)."""
        return self._block(start, stop).t()

    def add_to(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (M, n) + the offsets: in place on the CPU, a block at a time; the same numbers as
        logits + dense() (each element the same one addition)."""
        if logits.device.type != "cpu" or torch.is_grad_enabled():
            return logits + self.dense().to(logits.dtype)
        for start in range(0, logits.shape[1], ADD_BLOCK):
            logits[:, start : start + ADD_BLOCK] += self._block(start, start + ADD_BLOCK).t().to(logits.dtype)
        return logits

    def __add__(self, other: torch.Tensor) -> torch.Tensor:  # a later offset that has no `add_to`
        return self.dense() + other


def dense(offsets: torch.Tensor | CatalogueOffsets) -> torch.Tensor:
    """The offsets as a tensor (CatalogueOffsets.dense), whichever form they come in."""
    return offsets.dense() if isinstance(offsets, CatalogueOffsets) else offsets


def overlap_spec(spec: ContextSpec) -> ContextSpec:
    """The attributes AttributeOverlap reads: not text, not vectors. A text's words would make the offsets cost a
    pass over the whole catalogue per word slot (max_text_words of them: on the H&M sample, training 2x slower per
    epoch), and a word shared with the outfit is what the mean of the word embeddings can already say; a vector has
    no values to share."""
    return ContextSpec(tuple(f for f in spec.features if f.kind not in ("text", VECTOR_KIND)))


class AttributeOverlap(nn.Module):
    """o(a | outfit) = SCALE * sum_k w_k[x_k(a)] * [another article of the outfit has value x_k(a)]: a learned
    logit offset, one per attribute value, for a candidate whose value is already in the outfit.

    Why: the tied output layer scores a candidate by h . e_a, so "no second article of this product type" must
    be learned as a head state pointing away from every type the outfit holds, a rule learned from absences
    (studies/article_features/findings.md). The offset states the comparison; training learns its sign and size
    per value (on other data a type may repeat: socks, accessories). With attributes, a candidate's offset
    needs no id, so unseen articles get it too. w_k starts at 0, so a model starts exactly as without it; it is
    stored divided by SCALE because Adam moves a weight by about the learning rate per step, and an offset of
    several nats would otherwise take more steps than a run has. The predicted position is left out of the
    outfit it is compared with: in training it may hold its own article (BERT's kept 10%). Multi-valued
    attributes: a candidate's offset is the mean over its values. Text attributes are not read (overlap_spec).
    """

    SCALE = 10.0

    def __init__(self, spec: ContextSpec):
        super().__init__()
        self.spec = overlap_spec(spec)
        self.offsets = nn.ParameterList(nn.Parameter(torch.zeros(f.cardinality)) for f in self.spec.features)
        self._values: tuple | None = None  # value_table's cache: (the catalogue's tensors, their versions, the table)

    def forward(
        self,
        model,
        items: torch.Tensor,
        select: torch.Tensor,
        context: dict | None = None,
        articles: torch.Tensor | None = None,
    ) -> torch.Tensor | CatalogueOffsets:
        """The logit-offset seam: the offsets of `model`'s catalogue (`offsets`); over the whole catalogue
        without gradient (every evaluation pass, serving) by `catalogue_offsets`, else by `offsets_for`."""
        if articles is None and not torch.is_grad_enabled():
            return self.catalogue_offsets(model.attributes.catalogue(), items, select)
        return self.offsets_for(model.attributes.catalogue(), items, select, articles)

    def add_to(
        self,
        model,
        total: torch.Tensor | CatalogueOffsets,
        items: torch.Tensor,
        select: torch.Tensor,
        context: dict | None = None,
    ) -> torch.Tensor | CatalogueOffsets:
        """`total` + the catalogue's offsets (a new tensor: they are made whole to be added)."""
        return total + self(model, items, select, context)

    def offsets_for(
        self,
        catalogue: dict[str, torch.Tensor],
        items: torch.Tensor,
        select: torch.Tensor,
        articles: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(M, n_items) offsets at the `select` positions (bool, (B, L); row-major) of `items` (B, L, catalogue
        indices), for every article of `catalogue` (attribute name -> (n,) or (n, max_values) indices); or
        (M, C) for the catalogue indices `articles` (C,) only (the sampled softmax's candidates)."""
        rows, positions = select.nonzero(as_tuple=True)
        real = (items >= N_SPECIAL).unsqueeze(-1)  # [MASK], [UNK] and padding hold no attribute
        total = None
        for f, offset in zip(self.spec.features, self.offsets):
            values = catalogue[f.name]
            table = values if values.dim() == 2 else values.unsqueeze(1)  # (n, m)
            held = table[items]  # (B, L, m)
            counted = (real & (held != PAD_INDEX)).to(offset.dtype)
            # (shapes, not len(): the serving trace keeps them free)
            counts = offset.new_zeros(items.shape[0], f.cardinality)
            counts.scatter_add_(1, held.flatten(1), counted.flatten(1))
            own = offset.new_zeros(rows.shape[0], f.cardinality)
            own.scatter_add_(1, held[rows, positions], counted[rows, positions])
            present = (counts[rows] - own) > 0.5  # (M, cardinality): held by another article of the row
            gain = present.to(offset.dtype) * (offset * self.SCALE)
            candidates = table if articles is None else table[articles]  # (n or C, m)
            valid = (candidates != PAD_INDEX).to(offset.dtype)  # (n, m)
            term = sum(gain[:, candidates[:, j]] * valid[:, j] for j in range(candidates.shape[1]))  # (M, n)
            term = term / valid.sum(dim=-1).clamp_min(1.0)
            total = term if total is None else total + term
        assert total is not None, "overlap_spec leaves an AttributeOverlap at least one attribute"
        return total

    def value_table(self, catalogue: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """(index (n, S), weights (n, S) or None, pad): every article's values of the attributes read, as rows
        of one table of all their values (attribute k's value v at row start_k + v, the attributes in spec
        order; an empty slot at `pad`, the last row), and each slot's weight, 1 / the article's number of
        values of that attribute (None when every attribute is single-valued: all 1). Built once per
        catalogue (kept while the catalogue's tensors are the same, unmodified ones)."""
        tensors = tuple(catalogue[f.name] for f in self.spec.features)
        if self._values is not None:
            held, versions, table = self._values
            if len(held) == len(tensors) and all(
                a is b and a._version == v for a, b, v in zip(held, tensors, versions)
            ):
                return table
        dtype = self.offsets[0].dtype
        pad = sum(f.cardinality for f in self.spec.features)
        columns, weights, start = [], [], 0
        for f, values in zip(self.spec.features, tensors):
            slots = values if values.dim() == 2 else values.unsqueeze(1)  # (n, m)
            valid = slots != PAD_INDEX
            columns.append(torch.where(valid, slots + start, pad))
            weights.append(valid.to(dtype) / valid.sum(dim=-1, keepdim=True).clamp_min(1).to(dtype))
            start += f.cardinality
        multi = any(values.dim() == 2 for values in tensors)
        table = (torch.cat(columns, dim=1), torch.cat(weights, dim=1) if multi else None, pad)
        self._values = (tensors, tuple(t._version for t in tensors), table)
        return table

    def catalogue_offsets(
        self, catalogue: dict[str, torch.Tensor], items: torch.Tensor, select: torch.Tensor
    ) -> CatalogueOffsets:
        """`offsets_for` over every article of `catalogue`, for passes without gradient: the gains (M, values)
        of every attribute's values computed once, in one table, then expanded to the articles in one pass (a
        sum over each article's value slots: embedding_bag over `value_table`) instead of one gather over the
        catalogue per value slot: a CatalogueOffsets, added to the logits block by block, or made whole.

        The same numbers as offsets_for: bit for bit where every article holds at most one value of each
        attribute (the gains are the same products and are summed over the attributes in the same order);
        a multi-valued attribute's mean over its values is a sum of gain x (1 / values) instead of the sum
        of gains / values, which moves the offset by a rounding (within 1e-6)."""
        index, weights, pad = self.value_table(catalogue)
        rows, positions = select.nonzero(as_tuple=True)
        scale = torch.cat([offset * self.SCALE for offset in self.offsets])
        real = (items >= N_SPECIAL).unsqueeze(-1)  # [MASK], [UNK] and padding hold no attribute
        held = index[items]  # (B, L, S)
        counted = (real & (held != pad)).to(scale.dtype)
        counts = scale.new_zeros(items.shape[0], pad + 1)
        counts.scatter_add_(1, held.flatten(1), counted.flatten(1))
        own = scale.new_zeros(rows.shape[0], pad + 1)
        own.scatter_add_(1, held[rows, positions], counted[rows, positions])
        present = ((counts[rows] - own) > 0.5)[:, :pad]  # (M, values): held by another article of the row
        gain = F.pad(present.to(scale.dtype) * scale, (0, 1))  # the empty slot's row: 0, never read
        return CatalogueOffsets(index, weights, pad, gain.t().contiguous())


class HistoryRepeat(nn.Module):
    """A logit offset for a candidate a the customer's history holds (model.history_repeat), in the form of the
    popularity + own history yardstick's mixture: r(a) = log(1 + lambda(k) k(a) / (n p(a))) = softplus(log
    lambda(k) + log k(a) - log n - b(a)), for a history of n slots of which k(a) hold a (one per earlier outfit
    that held it) and the article's output bias b(a) (its log-popularity, as training.count_start starts it;
    read, not taught, by this offset). Added to the logits b(a) + ..., it makes p(a) + lambda(k) k(a) / n of an
    article's unnormalised mass: the mixture (1 - w) p + w k(a) / n, w = lambda / (1 + lambda). log lambda(k) =
    LOG_LAMBDA + S (w_0 + w_1 log n + v_k), learned from w = 0 and v = 0: a model whose logits start at the bias
    starts as the yardstick at its weight START_WEIGHT, the weight free to move with history length (w_1) and
    with how often the customer wore the article (v_k, one per worn count up to WORN_LEVELS, the last for that
    many or more).

    Why: the history's share of c, a pooled vector, cannot say "this very article again" among thousands, where
    counting the customer's own articles can; a constant offset would lift a popular article as much as one
    seen once, the mixture lifts each to its share of the history. The count is linear in k; v_k lets training
    bend it (an article worn once may be a one-off, one worn twice a staple). w and v are stored divided by S =
    AttributeOverlap.SCALE, as the overlap's offsets are."""

    START_WEIGHT = 0.1  # the yardstick's weight a model starts at (the middle of counts.HISTORY_WEIGHTS' range)
    LOG_LAMBDA = math.log(START_WEIGHT / (1 - START_WEIGHT))
    WORN_LEVELS = 8  # v_k for k = 1 .. WORN_LEVELS - 1, and one for WORN_LEVELS or more

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2))
        self.worn = nn.Parameter(torch.zeros(self.WORN_LEVELS))

    def gains(self, model, select: torch.Tensor, context: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(history (M, max_items) article indices, gain (M, max_items)) of the rows at the `select` positions:
        r for each article of a row's history, 0 for padding and [UNK] (no article)."""
        history = context[HISTORY_FEATURE][select.nonzero(as_tuple=True)[0]]
        held = history >= N_SPECIAL  # padding and [UNK] are no article
        n = held.sum(dim=-1, keepdim=True).clamp_min(1).to(self.weight.dtype)
        # an article holds a slot per earlier outfit that held it (data/history.py): its share is worn / n
        worn = ((history[:, :, None] == history[:, None, :]) & held[:, None, :]).sum(dim=-1).clamp_min(1)
        scale = AttributeOverlap.SCALE
        level = self.worn[worn.clamp_max(self.WORN_LEVELS) - 1]
        log_lambda = (
            self.LOG_LAMBDA
            + scale * (self.weight[0] + self.weight[1] * n.log() + level)
            - n.log()
            + worn.to(self.weight.dtype).log()
        )
        # an "_attrs" model's history may hold catalogue articles without an id: their bias is the [UNK] row's
        ids = torch.where(history < model.output_bias.shape[0], history, UNKNOWN_INDEX)
        bias = model.output_bias.detach()[ids].to(self.weight.dtype)
        return history, held.to(self.weight.dtype) * F.softplus(log_lambda - bias)

    def forward(
        self,
        model,
        items: torch.Tensor,
        select: torch.Tensor,
        context: dict | None = None,
        articles: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """(M, n_items) offsets at the `select` positions from the rows' histories (context[HISTORY_FEATURE]:
        (B, max_items) article indices, an article once per earlier outfit that held it), or (M, C) for the
        article indices `articles` (C,) only; None without the context."""
        if context is None:
            return None
        n_items = model.n_items
        history, gain = self.gains(model, select, context)
        if articles is None:
            return gain.new_zeros(history.shape[0], n_items).scatter_(1, history, gain)
        # a candidate's column, or C (a column then dropped) for an article that is none
        column = torch.full((n_items,), len(articles), dtype=torch.long, device=articles.device)
        column[articles] = torch.arange(len(articles), device=articles.device)
        out = gain.new_zeros(history.shape[0], len(articles) + 1).scatter_(1, column[history], gain)
        return out[:, :-1]

    def add_to(
        self,
        model,
        total: torch.Tensor | CatalogueOffsets,
        items: torch.Tensor,
        select: torch.Tensor,
        context: dict | None = None,
    ) -> torch.Tensor | CatalogueOffsets:
        """`total` (M, n_items; a tensor or a CatalogueOffsets) + these offsets over the whole catalogue, in
        place and only where they are not 0 (passes without gradient: no (M, n_items) tensor of zeros); the
        same numbers as total + forward()."""
        if context is None:
            return total
        history, gain = self.gains(model, select, context)
        if isinstance(total, CatalogueOffsets):
            return total.add_sparse(history, gain)
        return total.scatter_(1, history, total.gather(1, history) + gain.to(total.dtype))


# --- the seams, built from the settings ---------------------------------------------------------------------


def head_terms(model_cfg: ModelConfig, encoder: bool, reads_history: bool) -> nn.ModuleList:
    """The head-state terms of a model: the outfit bag and the history bag for the paper's encoders
    (`encoder`); none for the bag of items, whose head state already is a bag."""
    terms: list[nn.Module] = []
    if encoder:
        terms.append(OutfitBag(always=model_cfg.bag_path == "output"))
        if model_cfg.history_bag and reads_history:
            terms.append(HistoryBag())
    return nn.ModuleList(terms)


def logit_offsets(model_cfg: ModelConfig, attributes: ContextSpec | None, reads_history: bool) -> nn.ModuleList:
    """The logit offsets of a model: the attribute overlap (with attributes other than text) and the history
    repeat (with a history), in that order."""
    offsets: list[nn.Module] = []
    if attributes is not None and model_cfg.attribute_overlap and overlap_spec(attributes).features:
        offsets.append(AttributeOverlap(attributes))
    if model_cfg.history_repeat and reads_history:
        offsets.append(HistoryRepeat())
    return nn.ModuleList(offsets)
