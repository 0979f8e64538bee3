"""The readers: what a model reads beyond the paper's encoder, at two seams, each a list of small modules with
one signature, built from ModelConfig (`head_terms`, `logit_offsets`). A new reader is one class here and one
setting in ModelConfig.

    head terms     term(model, states, items, context, select) -> states + the term   (M, d) head states
    logit offsets  offset(model, items, select, context, articles) -> (M, n | C) or None, added to the logits

Every reader starts at zero contribution (a zero weight or gate, or a weight of 0 outside the warm-up), so a
model with it starts exactly as without it.
"""

from __future__ import annotations

import torch
from torch import nn

from contextual_bert.config import ModelConfig
from contextual_bert.data.feature_spec import (HISTORY_FEATURE, MASK_INDEX, N_SPECIAL, PAD_INDEX, ContextSpec)
from contextual_bert.model.context import history_mean


def other_articles_mean(e: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """(B, L, d): at every position of `items` (B, L), the mean of `e` (B, L, d) over the outfit's other
    articles, [MASK] and padding left out (zeros where there is none). The bag of items' state, and
    ContextualBert's bag path (model.bag_path)."""
    seen = ((items != PAD_INDEX) & (items != MASK_INDEX)).unsqueeze(-1).to(e.dtype)
    e = e * seen
    n_others = (seen.sum(dim=1, keepdim=True) - seen).clamp_min(1.0)
    return (e.sum(dim=1, keepdim=True) - e) / n_others

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

    def forward(self, model, states: torch.Tensor, items: torch.Tensor, context: dict | None,
                select: torch.Tensor) -> torch.Tensor:
        weight = 1.0 if self.always else (self.warmup_weight if self.training else 0.0)
        if weight <= 0:
            return states
        bag = other_articles_mean(model.article_vectors(model.item_embeddings, items), items)[select]
        return states + weight * (bag * model.input_scale).to(states.dtype)


class HistoryBag(nn.Module):
    """h += g * the mean of the customer's history's (tied) output vectors at the input's scale
    (model.history_bag): scored against a candidate's vector, how like the customer's earlier articles it is,
    the way the bag of items scores it against the outfit's. g is learned from 0."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(()))

    def forward(self, model, states: torch.Tensor, items: torch.Tensor, context: dict | None,
                select: torch.Tensor) -> torch.Tensor:
        rows = select.nonzero(as_tuple=True)[0]
        mean = history_mean(context[HISTORY_FEATURE][rows], lambda a: model.article_vectors(model.item_embeddings, a))
        return states + self.gate * (mean * model.input_scale).to(states.dtype)


# --- offsets added to the logits ---------------------------------------------------------------------------


def overlap_spec(spec: ContextSpec) -> ContextSpec:
    """The attributes AttributeOverlap reads: not text. A text's words would make the offsets cost a pass over the
    whole catalogue per word slot (max_text_words of them: on the H&M sample, training 2x slower per epoch), and a
    word shared with the outfit is what the mean of the word embeddings can already say."""
    return ContextSpec(tuple(f for f in spec.features if f.kind != "text"))


class AttributeOverlap(nn.Module):
    """o(a | outfit) = SCALE * sum_k w_k[x_k(a)] * [another article of the outfit has value x_k(a)]: a learned
    logit offset, one per attribute value, for a candidate whose value is already in the outfit.

    Why: the tied output layer scores a candidate by h . e_a, so "no second article of this product type" must
    be learned as a head state pointing away from every type the outfit holds, a rule learned from absences.
    On planted data, where no two articles of one type share an outfit, [None] + attributes did not beat the
    popularity that applies that rule (20k outfits; dropout and weight decay did not change it:
    studies/article_features/). The offset states the comparison; training learns its sign and size
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

    def forward(self, model, items: torch.Tensor, select: torch.Tensor, context: dict | None = None,
                articles: torch.Tensor | None = None) -> torch.Tensor:
        """The logit-offset seam: the offsets of `model`'s catalogue (`offsets`)."""
        return self.offsets_for(model.attributes.catalogue(), items, select, articles)

    def offsets_for(self, catalogue: dict[str, torch.Tensor], items: torch.Tensor, select: torch.Tensor,
                    articles: torch.Tensor | None = None) -> torch.Tensor:
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
        return total


class HistoryRepeat(nn.Module):
    """A logit offset for a candidate the customer's history holds (model.history_repeat): r = w_0 + w_1 log n,
    for a history of n articles. Why: the history's share of c, a pooled vector, cannot say "this very article
    again" among thousands, where counting the customer's own articles can (the popularity + own history
    yardstick); and the shorter a history, the larger a share of it each article is (w_1). w starts at 0, so a
    model starts as without it, and is stored divided by AttributeOverlap.SCALE for the same reason."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2))

    def forward(self, model, items: torch.Tensor, select: torch.Tensor, context: dict | None = None,
                articles: torch.Tensor | None = None) -> torch.Tensor | None:
        """(M, n_items) offsets at the `select` positions from the rows' histories (context[HISTORY_FEATURE]:
        (B, max_items) article indices, each article once), or (M, C) for the article indices `articles` (C,)
        only; None without the context."""
        if context is None:
            return None
        n_items = model.n_items
        history = context[HISTORY_FEATURE][select.nonzero(as_tuple=True)[0]]
        held = history >= N_SPECIAL  # padding and [UNK] are no article
        n = held.sum(dim=-1, keepdim=True).clamp_min(1).to(self.weight.dtype)
        gain = held.to(self.weight.dtype) * ((self.weight[0] + self.weight[1] * n.log()) * AttributeOverlap.SCALE)
        if articles is None:
            return gain.new_zeros(history.shape[0], n_items).scatter_(1, history, gain)
        # a candidate's column, or C (a column then dropped) for an article that is none
        column = torch.full((n_items,), len(articles), dtype=torch.long, device=articles.device)
        column[articles] = torch.arange(len(articles), device=articles.device)
        out = gain.new_zeros(history.shape[0], len(articles) + 1).scatter_(1, column[history], gain)
        return out[:, :-1]



# --- the seams, built from the settings ---------------------------------------------------------------------


def head_terms(model_cfg: ModelConfig, encoder: bool, reads_history: bool) -> nn.ModuleList:
    """The head-state terms of a model: the outfit bag and the history bag for the paper's encoders
    (`encoder`); none for the bag of items, whose head state already is a bag."""
    terms = []
    if encoder:
        terms.append(OutfitBag(always=model_cfg.bag_path == "output"))
        if model_cfg.history_bag and reads_history:
            terms.append(HistoryBag())
    return nn.ModuleList(terms)


def logit_offsets(model_cfg: ModelConfig, attributes: ContextSpec | None, reads_history: bool) -> nn.ModuleList:
    """The logit offsets of a model: the attribute overlap (with attributes other than text) and the history
    repeat (with a history), in that order."""
    offsets = []
    if attributes is not None and model_cfg.attribute_overlap and overlap_spec(attributes).features:
        offsets.append(AttributeOverlap(attributes))
    if model_cfg.history_repeat and reads_history:
        offsets.append(HistoryRepeat())
    return nn.ModuleList(offsets)
