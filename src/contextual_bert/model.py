"""Contextual BERT (Denk & Peleteiro Ramallo, 2020): a BERT encoder over a *set* of articles, conditioned on
a customer context vector c in one of five ways.

An outfit is a set, so there is no positional encoding; padding is hidden from attention by a key mask.
Inside the blocks the hidden states are laid out position-first, (L, B, d): a head's (L, d_head) slices are
then strided views that the batched matrix products read in place (batch-first, every head would be copied).
Names follow the paper: c is the context vector (per-feature embeddings, concatenated), c~ the global state,
V^V the per-block value projection of the global state, A^ the normalised self-attention output.

    none                 the encoder alone: c is ignored
    concat               [C]   every item embedding is concatenated with a projection of c, then projected
    new_position         [NP]  a projection of c is prepended as an extra position every item may attend to
    global_state         [GS]  c~ = FNN(c); every block adds B = V^V c~ to A^ between attention and FFN
    global_state_update  [GSU] [GS], and c~ is updated by its own FFN between blocks

The output layer is tied to the article embeddings (as in BERT), with a per-article bias, and is evaluated
only at the positions to predict: over 30k articles it costs more than the whole encoder.

Article attributes (issue 14; the "<model>_attrs" models, off for the paper's rows): an article's vector
e_a = E[id(a)] + sum_k A_k[x_k(a)], its id embedding plus one embedding per attribute (product type, colour,
...), at the input and, tied, at the output, so the output layer scores every article of the catalogue: an
article never seen in training has no id row of its own and reads the [UNK] row, and is ranked by what it is.
See ArticleAttributes for why a sum and not a concatenation with a projection, and for id dropout
(variants.<model>_attrs.id_dropout): in training, a share of the articles read the [UNK] id row as an unseen
one would, at the input and at the output, so that [UNK] + attributes, the vector every unseen article is
ranked by, is trained. And a candidate's logit gets a learned offset for each attribute value the rest of the
outfit already holds (AttributeOverlap; variants.<model>_attrs.attribute_overlap).
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from contextual_bert.config import BASELINE_MODELS, VARIANTS, ModelConfig, base_model, uses_attributes
from contextual_bert.errors import ContextualBertError
from contextual_bert.feature_spec import (
    HISTORY_FEATURE,
    MASK_INDEX,
    N_SPECIAL,
    PAD_INDEX,
    UNKNOWN_INDEX,
    ContextSpec,
    FeatureSpec,
)

# The paper's sizes (Table 1 setting) and the parameter counts it reports for them, counted without the
# article embeddings, the output layer and the customer-feature embeddings.
PAPER_SIZES = {"d_model": 128, "n_blocks": 4, "n_heads": 8, "d_ff": 256, "d_context": 736}
PAPER_PARAMETERS = {
    "none": 546_432,
    "concat": 673_664,
    "new_position": 640_768,
    "global_state": 723_328,
    "global_state_update": 921_856,
}
GLOBAL_STATE_VARIANTS = ("global_state", "global_state_update")


DRAW_BITS = 15  # dropout's draws on the CPU: integers uniform on [0, 2^15)


def keep_mask(x: torch.Tensor, p: float) -> tuple[torch.Tensor, float]:
    """Dropout's mask for x on the CPU: (bool, true where kept; the scale 1 / (1 - p) of the kept). Drawn as
    15-bit integers, four from each random int64: a mask from torch.rand's floats takes 1.8 times as long on
    the CPU, and those draws were a tenth of a training step. p is rounded to a multiple of 2^-15 (0.1 ->
    0.100006) and the scale uses the rounded p, so the expectation stays x."""
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_()  # 63 random bits each
    draws = words.view(torch.int16)[:n].view(x.shape).bitwise_and_(2**DRAW_BITS - 1)
    dropped = round(p * 2**DRAW_BITS)
    return draws >= dropped, 2**DRAW_BITS / (2**DRAW_BITS - dropped)


def scaled_keep_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """keep_mask as one float tensor: 0 where dropped, 1 / (1 - p) where kept."""
    keep, scale = keep_mask(x, p)
    return keep.to(x.dtype).mul_(scale)


class _DropoutFunction(torch.autograd.Function):
    """Dropout(x) (+ residual): x * scale * keep, the mask kept as bools (a quarter of a float mask's bytes
    to read back), the residual added in place. Bit for bit x * (keep * scale) (+ residual)."""

    @staticmethod
    def forward(ctx, x, residual, p: float):
        keep, scale = keep_mask(x if residual is None else residual, p)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        out = x.mul(scale).mul_(keep)
        return out if residual is None else out.add_(residual)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad.mul(ctx.scale).mul_(keep), grad if ctx.needs_input_grad[1] else None, None


class Dropout(nn.Dropout):
    """nn.Dropout whose mask on the CPU is `keep_mask`'s (bernoulli_'s takes 3.5 times as long there). On
    CUDA the fused kernel. `dropout(x, residual)` is Dropout(x) + residual, in one pass less on the CPU (x
    may broadcast to the residual's shape: each element then gets its own mask)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not self.training or self.p == 0 or x.is_cuda:
            out = F.dropout(x, self.p, self.training)
            return out if residual is None else out + residual
        if residual is not None and x.shape != residual.shape:
            x = x.expand_as(residual)
        return _DropoutFunction.apply(x, residual, self.p)


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


class MultiHeadSelfAttention(nn.Module):
    """A = MultiHead(H): W^Q, W^K, W^V, W^O; padded keys get no attention.

    Written out rather than F.scaled_dot_product_attention: over at most 9 positions the softmax is the
    costly part, and taken over a leading axis (keys first) it vectorises; on the CPU the whole sublayer
    runs in about half the time. H is position-first, (L, B, d), so the heads are views, not copies.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        if d_model % n_heads:
            raise ContextualBertError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.output = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)

    def forward(self, h: torch.Tensor, key_bias: torch.Tensor, select: torch.Tensor | None = None) -> torch.Tensor:
        """h: (L, B, d); key_bias: (B, 1, 1, L), 0 for real keys and -inf for padding. Returns (L, B, d), or
        (M, d) at the positions where `select` (bool, (B, L)) is true, in row-major (B, L) order."""
        length, batch, d_model = h.shape

        def heads(x):  # (L, B, d) -> (B * heads, L, d_head), a view
            return x.view(length, batch * self.n_heads, self.d_head).transpose(0, 1)

        q, k, v = heads(self.query(h)), heads(self.key(h)), heads(self.value(h))
        scores = torch.bmm(q, k.transpose(1, 2)).mul_(self.d_head**-0.5)
        scores.view(batch, self.n_heads, length, length).add_(key_bias)
        probs = torch.softmax(scores.permute(2, 0, 1), dim=0).permute(1, 2, 0)  # over the keys
        a = torch.bmm(self.dropout(probs), v).view(batch, self.n_heads, length, self.d_head)
        a = a.permute(2, 0, 1, 3).reshape(length, batch, d_model)
        return self.output(a if select is None else a.transpose(0, 1)[select])


class FeedForward(nn.Module):
    """FFN(x) = W_2 GELU(W_1 x), position-wise."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.intermediate = nn.Linear(d_model, d_ff)
        self.output = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(F.gelu(self.intermediate(x)))


class GlobalStateAttention(nn.Module):
    """[GS] B = V^V c~, then LayerNorm(Dropout(B) + A^) without affine parameters.

    Attention from a position over the single vector c~ gives weight 1 to it, so the result is its
    value whatever V^Q and V^K are: they are left out, and B is the same for every position.
    """

    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.value = nn.Linear(d_model, d_model)  # V^V
        self.dropout = Dropout(dropout)
        self.norm = nn.LayerNorm(d_model, elementwise_affine=False)

    def forward(self, a_hat: torch.Tensor, global_state: torch.Tensor, rows: torch.Tensor | None = None):
        """a_hat: (L, B, d), or (M, d) for positions in outfits `rows`; global_state: (B, d)."""
        b = self.value(global_state)  # one per outfit, the same for all its positions
        b = b.unsqueeze(0) if rows is None else b[rows]
        # Dropout after broadcasting: each position gets its own mask, as dropout on any other sublayer
        # output does (one mask per outfit would silence the same units of c~ at all its positions).
        return self.norm(self.dropout(b, a_hat))


class Block(nn.Module):
    """One post-norm Transformer block (as in BERT), with the [GS] sublayer between attention and FFN."""

    def __init__(self, cfg: ModelConfig, global_state: bool):
        super().__init__()
        self.attention = MultiHeadSelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.attention_norm = nn.LayerNorm(cfg.d_model)
        self.global_state_attention = GlobalStateAttention(cfg.d_model, cfg.dropout) if global_state else None
        self.feed_forward = FeedForward(cfg.d_model, cfg.d_ff)
        self.feed_forward_norm = nn.LayerNorm(cfg.d_model)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, h, key_bias, global_state=None, select=None):
        """(L, B, d) -> (L, B, d); with `select` (bool, (B, L)) only those positions come out, (M, d) in
        row-major (B, L) order, and everything after attention is computed for them alone."""
        residual, rows = (h, None) if select is None else (h.transpose(0, 1)[select], select.nonzero()[:, 0])
        a_hat = self.attention_norm(self.dropout(self.attention(h, key_bias, select), residual))
        if self.global_state_attention is not None:
            a_hat = self.global_state_attention(a_hat, global_state, rows)
        return self.feed_forward_norm(self.dropout(self.feed_forward(a_hat), a_hat))


class GlobalState(nn.Module):
    """[GS] c~ = FNN(c): d_context -> d_model -> d_model with a ReLU between."""

    def __init__(self, d_context: int, d_model: int):
        super().__init__()
        self.hidden = nn.Linear(d_context, d_model)
        self.output = nn.Linear(d_model, d_model)

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return self.output(F.relu(self.hidden(c)))


class GlobalStateUpdate(nn.Module):
    """[GSU] c~(l+1) = c~(l) + Dropout(g * Norm(FFN(c~(l))) + b), between two blocks; weights not shared.

    The paper writes c~(l+1) := FNN(c~(l)) and counts 256 parameters per update besides the FFN: a
    LayerNorm's gain g and bias b. Where the norm sits decides the state's scale. LayerNorm(c~ + FFN(c~))
    (post-norm, as in the blocks) brings the state to std ~1 while c~(1) = FNN(c) starts at ~0.2, so blocks
    2-4 would read an offset B five times larger than block 1 and than [GS]. Here the norm shapes the
    update only, and g = b = 0 at initialisation (as ReZero / LayerScale): every update starts as the
    identity, [GSU] starts out exactly as [GS], and the state's scale changes only as far as training finds
    it useful. Same parameter count as the paper's.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.feed_forward = FeedForward(cfg.d_model, cfg.d_ff)
        self.norm = nn.LayerNorm(cfg.d_model)  # g, b: the update's scale, learned from zero
        self.dropout = Dropout(cfg.dropout)
        nn.init.zeros_(self.norm.weight)

    def forward(self, global_state: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.norm(self.feed_forward(global_state)), global_state)


class ConcatInput(nn.Module):
    """[C] x_i = W [e_i; W_c c]: c projected to d_model, concatenated to every item embedding."""

    def __init__(self, d_context: int, d_model: int):
        super().__init__()
        self.context_projection = nn.Linear(d_context, d_model)
        self.projection = nn.Linear(2 * d_model, d_model)

    def forward(self, e: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        projected = self.context_projection(c).unsqueeze(1).expand(-1, e.shape[1], -1)
        return self.projection(torch.cat([e, projected], dim=-1))


ATTRIBUTE_COMBINES = ("sum", "concat")


class TextEmbedding(nn.EmbeddingBag):
    """A text attribute's vector (kind text: a product's name or description): the mean of its words'
    embeddings (feature_store.text_words; PAD-padded rows of word indices; an unseen word reads the UNKNOWN
    row, a text without words the MISSING row)."""

    def __init__(self, n_words: int, dim: int):
        super().__init__(n_words, dim, mode="mean", padding_idx=PAD_INDEX)


def attribute_embedding(feature: FeatureSpec, width: int) -> nn.Module:
    """The embedding table of one article attribute, by its kind."""
    if feature.kind == "text":
        return TextEmbedding(feature.cardinality, width)
    if feature.kind == "multi_categorical":
        return nn.EmbeddingBag(feature.cardinality, width, mode="mean", padding_idx=PAD_INDEX)
    return nn.Embedding(feature.cardinality, width, padding_idx=PAD_INDEX)


class ArticleAttributes(nn.Module):
    """e_a from an article's id embedding and its attribute embeddings, for every article of the catalogue.

    sum:    e_a = (E[id(a)] + sum_k A_k[x_k(a)]) / sqrt(1 + K), each A_k of width d_model; the scale keeps
            e_a at the id embeddings' N(0, 1/d) at initialisation.
    concat: e_a = W [E[id(a)]; A_1[x_1(a)]; ...; A_K[x_K(a)]] + b, each A_k of its spec's dim.

    The sum is the default, by measurement: on planted data (6,000 outfits, 3,000 articles, product type
    as the attribute; [None] + attributes, one seed, 8 epochs; reports/experiments/article_features/) the sum
    reached validation cross-entropy 7.302 (test 7.281, CI 7.20-7.36) and concat + projection 7.360 (test
    7.328, CI 7.25-7.40), with 15,536 more parameters for concat. The gap is within the test CI: the
    tie-breakers are that the sum has fewer parameters and keeps an unseen article's vector a plain sum of
    trained attribute rows and the [UNK] row, where the projection mixes the id part into every article.

    Id dropout (`ids`, rate variants.<model>_attrs.id_dropout, training mode only). Without it the id embeddings
    memorise the training outfits before the attribute embeddings learn anything (at ~12 sightings per article the
    ids alone fit the training set), and the [UNK] id row is never a target, so the model learns that articles
    without an id are never the answer. With it, each real article at an input position and each catalogue row of
    the output layer (with its bias) reads [UNK] instead of its id with probability id_dropout: those articles
    must be recognised and ranked by their attributes, exactly as an unseen one is at test time. Drawn per
    position at the input and per catalogue row at the output (independently), from the global generator as
    dropout is, so a resumed run repeats its draws. The rate (training.id_dropout_rate) is by default the share
    of the validation outfits' articles that have no id, at least 0.05: on H&M's sample, where half the test
    targets are unseen, the models without id dropout stop after one epoch with recall@5 0; on planted data with
    hidden tastes, where every article is known and the ids carry the tastes, a fixed 0.5 trailed 0.05 by
    0.06-0.08 nats of validation at equal epochs at 150k outfits (docs/encoder_recipe.md).

    The catalogue's encoded attributes are buffers outside the state_dict (`set_catalogue`): the weights do
    not depend on how many articles there are, so a served model takes a larger catalogue without
    retraining. An article without an id embedding (index >= n_ids) reads the [UNK] id row. Multi-valued
    attributes are the mean of their values' embeddings, text the mean of its words' (TextEmbedding); missing /
    unknown values have their own rows.
    """

    def __init__(self, spec: ContextSpec, n_ids: int, d_model: int, combine: str = "sum"):
        super().__init__()
        if combine not in ATTRIBUTE_COMBINES:
            raise ContextualBertError(f"unknown attribute combine '{combine}' (one of {', '.join(ATTRIBUTE_COMBINES)})")
        if not spec.features:
            raise ContextualBertError("a model with article attributes needs at least one attribute")
        self.spec, self.n_ids, self.combine = spec, n_ids, combine
        self.id_dropout = 0.0  # a training setting (variants.<model>_attrs.id_dropout; training.fit), not a weight
        widths = [d_model if combine == "sum" else f.dim for f in spec.features]
        self.embeddings = nn.ModuleList(attribute_embedding(f, w) for f, w in zip(spec.features, widths))
        for table in self.embeddings:
            nn.init.normal_(table.weight, std=d_model**-0.5)
            with torch.no_grad():
                table.weight[PAD_INDEX].zero_()
        self.projection = nn.Linear(d_model + sum(widths), d_model) if combine == "concat" else None
        self.scale = (1 + len(spec.features)) ** -0.5
        self.set_catalogue({f.name: torch.zeros((n_ids, f.max_values) if f.is_list else n_ids,
                                                dtype=torch.long) for f in spec.features})  # fmt: skip

    @property
    def n_items(self) -> int:
        return int(self.id_rows.shape[0])

    def set_catalogue(self, attributes: dict[str, torch.Tensor]) -> None:
        """The articles to score: attribute name -> (n,) or (n, max_values) indices, rows 0..n_ids-1 being
        the articles with an id embedding. Not part of the state_dict."""
        missing = [f.name for f in self.spec.features if f.name not in attributes]
        if missing:
            raise ContextualBertError(f"the catalogue has no attribute {missing[0]!r}")
        n = len(attributes[self.spec.features[0].name])
        if n < self.n_ids:
            raise ContextualBertError(f"the catalogue has {n} rows, fewer than the model's {self.n_ids} article ids")
        device = self.embeddings[0].weight.device
        for f in self.spec.features:
            values = attributes[f.name].to(device=device, dtype=torch.long)
            if len(values) != n:
                raise ContextualBertError(f"catalogue attribute {f.name!r} has {len(values)} rows, not {n}")
            if values.numel() and int(values.max()) >= f.cardinality:
                raise ContextualBertError(f"catalogue attribute {f.name!r} holds index {int(values.max())}, "
                                          f"beyond its {f.cardinality} embedding rows")
            self.register_buffer(f"catalogue_{f.name}", values, persistent=False)
        rows = torch.arange(n, device=device)
        self.register_buffer("id_rows", rows.masked_fill(rows >= self.n_ids, UNKNOWN_INDEX), persistent=False)

    def catalogue(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f"catalogue_{f.name}") for f in self.spec.features}

    def ids(self, flat: torch.Tensor | None = None) -> torch.Tensor:
        """The id rows of the article indices `flat` (1-d), or of the whole catalogue. In training mode, with
        id_dropout > 0, each real article's id row is replaced by [UNK] with that probability (one draw per
        row, from the global generator, as dropout's): the article is then seen as an unseen one would be."""
        ids = self.id_rows if flat is None else self.id_rows[flat]
        if self.training and self.id_dropout > 0:
            dropped = (torch.rand(ids.shape, device=ids.device) < self.id_dropout) & (ids >= N_SPECIAL)
            ids = ids.masked_fill(dropped, UNKNOWN_INDEX)
        return ids

    def forward(self, id_embeddings: nn.Embedding, articles: torch.Tensor | None = None,
                ids: torch.Tensor | None = None) -> torch.Tensor:
        """e_a for the article indices `articles` (any shape; (..., d)), or for the whole catalogue (n, d);
        `ids`: the id rows to read (from `ids()`), when the caller needs them too (the output bias)."""
        flat = None if articles is None else articles.reshape(-1)
        ids = self.ids(flat) if ids is None else ids
        parts = [id_embeddings(ids)]
        for f, table in zip(self.spec.features, self.embeddings):
            values = getattr(self, f"catalogue_{f.name}")
            parts.append(table(values if flat is None else values[flat]))
        if self.projection is not None:
            e = self.projection(torch.cat(parts, dim=-1))
        else:
            e = torch.stack(parts).sum(dim=0) * self.scale
        return e if articles is None else e.view(*articles.shape, -1)


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
    reports/experiments/article_features/). The offset states the comparison; training learns its sign and size
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

    def forward(self, catalogue: dict[str, torch.Tensor], items: torch.Tensor, select: torch.Tensor,
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

    def forward(self, history: torch.Tensor, rows: torch.Tensor, n_items: int,
                articles: torch.Tensor | None = None) -> torch.Tensor:
        """(M, n_items) offsets for the rows `rows` (M,) of `history` (B, max_items; article indices, each
        article once), or (M, C) for the article indices `articles` (C,) only."""
        history = history[rows]
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


class ArticleScores:
    """The output side shared by the models: logits over the real articles from head states, and the
    logits at the one [MASK] of every row. Needs `forward`, `head` and `output_layer`.

    With article attributes (`attributes` not None) the articles are those of the catalogue, n_items of
    them, of which the first n_ids have an id embedding: `article_vectors` and the per-id bias come from
    `ArticleAttributes`, and `set_catalogue` changes which articles are scored without touching a weight."""

    def _init_articles(self, variant: str, n_items: int, attributes: ContextSpec | None, combine: str,
                       overlap: bool = False) -> None:
        """n_ids (article id rows) and, for a "<model>_attrs" variant, the attribute embeddings (and, with
        `overlap`, the offsets for attribute values already in the outfit)."""
        self.n_ids = n_items
        self.attributes = self.overlap = None  # (no class attributes: they would hide the submodules)
        self.repeat = HistoryRepeat() if self.model_cfg.history_repeat and self.reads_history else None
        if overlap and attributes is None:
            raise ContextualBertError(f"model '{variant}' reads article ids only; it has no attribute overlap")
        if uses_attributes(variant) != (attributes is not None and len(attributes.features) > 0):
            raise ContextualBertError(
                f"model '{variant}' " + ("needs article attributes (features.article_features: true)"
                                         if uses_attributes(variant) else "reads article ids only; it takes no attributes"))
        if attributes is not None:
            self.attributes = ArticleAttributes(attributes, n_items, self.model_cfg.d_model, combine)
            self.overlap = AttributeOverlap(attributes) if overlap and overlap_spec(attributes).features else None

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
        """(M, n_items) logit offsets at the `select` positions from the rest of their outfit (AttributeOverlap)
        and, given the `context`, from the customer's history (HistoryRepeat); or (M, C) for the catalogue
        indices `articles` only; None for a model without them."""
        parts = []
        if self.overlap is not None:
            parts.append(self.overlap(self.attributes.catalogue(), items, select, articles))
        if self.repeat is not None and context is not None:
            rows = select.nonzero(as_tuple=True)[0]
            parts.append(self.repeat(context[HISTORY_FEATURE], rows, self.n_items, articles))
        return sum(parts[1:], parts[0]) if parts else None

    def article_logits(self, head_states: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        """(M, n_items - N_SPECIAL) logits over the real articles (specials are never predicted); `offsets`
        from `outfit_offsets` at the same positions."""
        weight, bias = self.output_layer()
        logits = F.linear(head_states, weight[N_SPECIAL:].to(head_states.dtype), bias[N_SPECIAL:].to(head_states.dtype))
        return logits if offsets is None else logits + offsets[:, N_SPECIAL:].to(logits.dtype)

    def head_states(self, items: torch.Tensor, context: dict | None, select: torch.Tensor,
                    bag_weight: float = 0.0) -> torch.Tensor:
        """(M, d) the states the output layer scores at the `select` positions (bool, (B, L)). `bag_weight`:
        ContextualBert's (training.bag_warmup_weight)."""
        return self.head(self.forward(items, context, select=select))

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


class ContextualBert(ArticleScores, nn.Module):
    """The encoder over a set of article indices (PAD_INDEX-padded), one of the five variants."""

    def __init__(self, model_cfg: ModelConfig, variant: str, n_items: int, spec: ContextSpec,
                 attributes: ContextSpec | None = None, combine: str = "sum", overlap: bool = False):
        super().__init__()
        if base_model(variant) not in VARIANTS:
            raise ContextualBertError(f"unknown variant '{variant}' (one of {', '.join(VARIANTS)}, or one of "
                                      "them + '_attrs')")
        if n_items <= N_SPECIAL:
            raise ContextualBertError(f"n_items {n_items} leaves no real article after {N_SPECIAL} special rows")
        self.model_cfg, self.variant, self.spec = model_cfg, variant, spec
        conditioning = base_model(variant)  # the paper's variant; "_attrs" changes only the article vectors
        d, d_context = model_cfg.d_model, spec.d_context
        uses_context = conditioning != "none"
        if uses_context and d_context == 0:
            raise ContextualBertError(f"variant '{variant}' needs context features; the spec has none")

        self.item_embeddings = nn.Embedding(n_items, d, padding_idx=PAD_INDEX)  # row MASK_INDEX is [MASK]
        # (attribute named as before the class was renamed: checkpoints' state_dict keys carry it)
        self.context_encoder = ContextEmbedding(spec, model_cfg) if uses_context else None
        self.concat_input = ConcatInput(d_context, d) if conditioning == "concat" else None
        self.context_position = nn.Linear(d_context, d) if conditioning == "new_position" else None
        global_state = conditioning in GLOBAL_STATE_VARIANTS
        self.global_state = GlobalState(d_context, d) if global_state else None
        self.embedding_dropout = Dropout(model_cfg.dropout)
        self.blocks = nn.ModuleList(Block(model_cfg, global_state) for _ in range(model_cfg.n_blocks))
        self.global_state_updates = (
            nn.ModuleList(GlobalStateUpdate(model_cfg) for _ in range(model_cfg.n_blocks - 1))
            if conditioning == "global_state_update"
            else None
        )
        self.head_transform = nn.Linear(d, d)
        self.output_bias = nn.Parameter(torch.zeros(n_items))  # output weights: tied to item_embeddings
        # Item embeddings N(0, 1/d), multiplied by sqrt(d) at the input (as in Vaswani et al.): unit scale
        # into the blocks, which have no embedding LayerNorm, and small first logits from the tied output
        # layer. (BERT's N(0, 0.02) barely reaches the blocks; N(0, 1) starts far above uniform loss.)
        # Everything else keeps PyTorch's default initialisation.
        nn.init.normal_(self.item_embeddings.weight, std=d**-0.5)
        with torch.no_grad():
            self.item_embeddings.weight[PAD_INDEX].zero_()
        self.input_scale = d**0.5
        self._init_articles(variant, n_items, attributes, combine, overlap)  # last: the paper's models draw as before
        # the history bag (model.history_bag): g starts at 0, so a model starts as without it
        self.history_gate = nn.Parameter(torch.zeros(())) if model_cfg.history_bag and self.reads_history else None

    # --- the encoder ---------------------------------------------------------------------------------

    def forward(
        self, items: torch.Tensor, context: dict[str, torch.Tensor] | None = None, select: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Hidden states (B, L, d_model) at the L item positions of `items` (B, L); or, given `select`
        (bool, (B, L)), (M, d_model) at those positions only, in row-major order. Only they are needed for
        a prediction, and the last block then computes just them after its attention."""
        c = self.context(context)
        x = self.article_vectors(self.item_embeddings, items) * self.input_scale
        if self.model_cfg.bag_path == "input":  # the bag of items inside the encoder, no parameter
            x = x + other_articles_mean(x, items)
        is_padding = items == PAD_INDEX
        if self.concat_input is not None:
            x = self.concat_input(x, c)
        x = x.transpose(0, 1).contiguous()  # position-first for the blocks (MultiHeadSelfAttention)
        if self.context_position is not None:
            x = torch.cat([self.context_position(c).unsqueeze(0), x], dim=0)
            is_padding = F.pad(is_padding, (1, 0), value=False)  # every position may attend to c
            select = None if select is None else F.pad(select, (1, 0), value=False)
        key_bias = torch.zeros(is_padding.shape, dtype=x.dtype, device=x.device)
        key_bias = key_bias.masked_fill_(is_padding, float("-inf"))[:, None, None, :]
        global_state = self.global_state(c) if self.global_state is not None else None

        h = self.embedding_dropout(x)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            if i > 0 and self.global_state_updates is not None:
                global_state = self.global_state_updates[i - 1](global_state)
            h = block(h, key_bias, global_state, select if i == last else None)
        if select is not None:
            return h
        return (h[1:] if self.context_position is not None else h).transpose(0, 1)

    def context(self, context: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
        """c, or None for [None]; a history is read through the article vectors at the input's scale."""
        if self.context_encoder is None:
            return None
        return self.context_encoder(context, lambda a: self.article_vectors(self.item_embeddings, a) * self.input_scale)

    # --- the output layer, only where needed ---------------------------------------------------------

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head transform before the output layer: GELU(W h)."""
        return F.gelu(self.head_transform(hidden))

    def head_states(self, items: torch.Tensor, context: dict | None, select: torch.Tensor,
                    bag_weight: float = 0.0) -> torch.Tensor:
        """GELU(W h) at the `select` positions, plus the bag state: with weight 1 under model.bag_path
        "output", so that h_a . e_a starts as a tied bag of items' score and the blocks add what a bag
        cannot; else with `bag_weight`, the warm-up's (train.bag_warmup_epochs), 0 after it."""
        states = self.head(self.forward(items, context, select=select))
        weight = 1.0 if self.model_cfg.bag_path == "output" else bag_weight
        if weight > 0:
            states = states + weight * self.bag_state(items, select).to(states.dtype)
        if self.history_gate is not None:
            states = states + self.history_gate * self.history_state(context, select).to(states.dtype)
        return states

    def history_state(self, context: dict[str, torch.Tensor], select: torch.Tensor) -> torch.Tensor:
        """(M, d) the mean of the customer's history's (tied) output vectors at the `select` positions, at the
        input's scale (model.history_bag): scored against a candidate's vector, how like the customer's
        earlier articles it is, the way the bag of items scores it against the outfit's."""
        rows = select.nonzero(as_tuple=True)[0]
        return history_mean(context[HISTORY_FEATURE][rows],
                            lambda a: self.article_vectors(self.item_embeddings, a)) * self.input_scale

    def bag_state(self, items: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
        """(M, d) the mean of the outfit's other articles' (tied) output vectors at the `select` positions, at
        the input's scale: the bag path's term (model.bag_path "output", train.bag_warmup_epochs)."""
        return other_articles_mean(self.article_vectors(self.item_embeddings, items), items)[select] * self.input_scale

    def output_layer(self, articles: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight (n_items, d), bias (n_items,)) of the output layer: tied to the article vectors; only the
        rows of the catalogue indices `articles` when given (ArticleScores.output_articles)."""
        return self.output_articles(self.item_embeddings, self.attributes, articles)


# --- the learned baseline -----------------------------------------------------------------------------


def other_articles_mean(e: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """(B, L, d): at every position of `items` (B, L), the mean of `e` (B, L, d) over the outfit's other
    articles, [MASK] and padding left out (zeros where there is none). The bag of items' state, and
    ContextualBert's bag path (model.bag_path)."""
    seen = ((items != PAD_INDEX) & (items != MASK_INDEX)).unsqueeze(-1).to(e.dtype)
    e = e * seen
    n_others = (seen.sum(dim=1, keepdim=True) - seen).clamp_min(1.0)
    return (e.sum(dim=1, keepdim=True) - e) / n_others


class BagOfItems(ArticleScores, nn.Module):
    """A learned baseline beside popularity (item2vec / CBOW): the article at a position is scored from the
    mean of the other articles' embeddings (plus W_c c in the context version), dotted with output
    embeddings of its own. No attention and no interaction between articles: what co-occurrence alone (and
    c) explains. Same interface as ContextualBert, so the same training, early stopping and evaluation run
    it; a transformer that does not beat it has not earned its parameters.
    """

    def __init__(self, model_cfg: ModelConfig, variant: str, n_items: int, spec: ContextSpec,
                 attributes: ContextSpec | None = None, combine: str = "sum", overlap: bool = False):
        super().__init__()
        if base_model(variant) not in BASELINE_MODELS:
            raise ContextualBertError(f"unknown baseline '{variant}' (one of {', '.join(BASELINE_MODELS)})")
        self.model_cfg, self.variant, self.spec = model_cfg, variant, spec
        d = model_cfg.d_model
        uses_context = base_model(variant) == "bag_of_items_context"
        if uses_context and spec.d_context == 0:
            raise ContextualBertError(f"'{variant}' needs context features; the spec has none")
        self.item_embeddings = nn.Embedding(n_items, d, padding_idx=PAD_INDEX)
        self.output_embeddings = nn.Embedding(n_items, d)
        self.output_bias = nn.Parameter(torch.zeros(n_items))
        self.context_encoder = ContextEmbedding(spec, model_cfg) if uses_context else None
        self.context_projection = nn.Linear(spec.d_context, d) if uses_context else None
        self.dropout = Dropout(model_cfg.dropout)
        for table in (self.item_embeddings, self.output_embeddings):
            nn.init.normal_(table.weight, std=d**-0.5)  # small first logits, as in ContextualBert
        self._init_articles(variant, n_items, attributes, combine, overlap)
        # the untied output side has attribute embeddings of its own, reading the same catalogue
        self.output_attributes = (ArticleAttributes(attributes, n_items, d, combine) if self.attributes is not None
                                  else None)  # fmt: skip

    def set_catalogue(self, attributes: dict[str, torch.Tensor]) -> None:
        super().set_catalogue(attributes)
        self.output_attributes.set_catalogue(attributes)

    def forward(self, items: torch.Tensor, context: dict | None = None, select: torch.Tensor | None = None):
        """(B, L, d): at every position, the mean embedding of the outfit's other articles ([MASK] and
        padding left out), plus W_c c; (M, d) at the `select` positions only."""
        h = other_articles_mean(self.article_vectors(self.item_embeddings, items), items)
        if self.context_projection is not None:
            c = self.context_encoder(context, lambda a: self.article_vectors(self.item_embeddings, a))
            h = h + self.context_projection(c).unsqueeze(1)
        h = self.dropout(h)
        return h if select is None else h[select]

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def output_layer(self, articles: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.output_articles(self.output_embeddings, self.output_attributes, articles)


def build_model(model_cfg: ModelConfig, variant: str, n_items: int, spec: ContextSpec,
                attributes: ContextSpec | None = None, combine: str = "sum", overlap: bool = False) -> nn.Module:
    """A paper variant (ContextualBert) or a learned baseline (BagOfItems), by name; a "<model>_attrs" name
    with the article attributes' spec (n_items: the article ids; the catalogue comes by `set_catalogue`) and,
    with `overlap`, AttributeOverlap's offsets."""
    model_class = BagOfItems if base_model(variant) in BASELINE_MODELS else ContextualBert
    return model_class(model_cfg, variant, n_items, spec, attributes, combine, overlap)


# --- parameter counts ---------------------------------------------------------------------------------


def count_paper_parameters(model: nn.Module) -> int:
    """Parameters as the paper counts them: without the article embeddings, the output layer and the
    customer-feature embeddings."""
    excluded = {id(model.item_embeddings.weight), id(model.output_bias)}
    if getattr(model, "output_embeddings", None) is not None:  # the bag of items' untied output layer
        excluded.add(id(model.output_embeddings.weight))
    if model.context_encoder is not None:
        excluded |= {id(p) for p in model.context_encoder.parameters()}
    for article_side in (model.attributes, getattr(model, "output_attributes", None), model.overlap):
        if article_side is not None:  # attribute embeddings (and projection) belong to the article embeddings
            excluded |= {id(p) for p in article_side.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in excluded)


def describe_variants(model_cfg: ModelConfig, paper: bool = False, d_context: int | None = None) -> dict:
    """Counted parameters of every variant, at the paper's sizes or at `model_cfg`'s (d_context: the
    width of c, by default the paper's 736)."""
    if paper:
        sizes = dict(PAPER_SIZES)
        model_cfg = model_cfg.model_copy(update={k: v for k, v in sizes.items() if k != "d_context"})
    else:
        sizes = {
            "d_model": model_cfg.d_model,
            "n_blocks": model_cfg.n_blocks,
            "n_heads": model_cfg.n_heads,
            "d_ff": model_cfg.d_ff,
            "d_context": PAPER_SIZES["d_context"] if d_context is None else d_context,
        }
    # The counted parameters do not depend on the context features' split of d_context nor on n_items.
    spec = ContextSpec((FeatureSpec("c", "categorical", "customer", N_SPECIAL + 1, sizes["d_context"]),))
    variants = {}
    for variant in VARIANTS:
        counted = count_paper_parameters(ContextualBert(model_cfg, variant, N_SPECIAL + 1, spec))
        row = {"parameters": counted, "paper_parameters": PAPER_PARAMETERS[variant]}
        if paper:
            row["matches_paper"] = counted == PAPER_PARAMETERS[variant]
        variants[variant] = row
    return {"sizes": sizes, "paper": paper, "variants": variants}


# --- checkpoints --------------------------------------------------------------------------------------


def atomic_save(obj, path: Path, write=torch.save) -> None:
    """`write(obj, tmp)` to a temporary file, then rename: a run killed while saving leaves the old file intact.
    The one atomic writer: checkpoints with torch.save, the training's JSON files with their own `write`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def model_payload(model: nn.Module) -> dict:
    """What rebuilds the model with no other file: config, variant, n_items, spec and weights."""
    payload = {
        "model_config": model.model_cfg.model_dump(),
        "variant": model.variant,
        "n_items": model.n_ids,
        "spec": model.spec.to_json(),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }
    if model.attributes is not None:  # the attributes' spec and the catalogue the model was trained with
        payload["attributes"] = model.attributes.spec.to_json()
        payload["combine"] = model.attributes.combine
        payload["overlap"] = model.overlap is not None
        payload["catalogue"] = {k: v.detach().cpu() for k, v in model.attributes.catalogue().items()}
    return payload


# what a checkpoint from before a model setting existed was trained with
CHECKPOINT_BEFORE = {"history_repeat": False, "history_bag": False}


def model_from_payload(payload: dict) -> nn.Module:
    attributes = payload.get("attributes")
    model = build_model(
        ModelConfig(**(CHECKPOINT_BEFORE | payload["model_config"])),
        payload["variant"],
        payload["n_items"],
        ContextSpec.from_json(payload["spec"]),
        None if attributes is None else ContextSpec.from_json(attributes),
        payload.get("combine", "sum"),
        payload.get("overlap", False),  # checkpoints from before AttributeOverlap have none
    )
    model.load_state_dict(payload["state_dict"])
    if attributes is not None:
        model.set_catalogue(payload["catalogue"])
    return model


def save_checkpoint(path: Path, model: ContextualBert, meta: dict) -> None:
    atomic_save({**model_payload(model), "meta": meta}, path)


def load_checkpoint(path: Path, map_location="cpu") -> tuple[nn.Module, dict]:
    """The model (in eval mode, on map_location) and the meta dict saved with it."""
    path = Path(path)
    if not path.exists():
        raise ContextualBertError(f"{path}: checkpoint not found (train this run first)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        model = model_from_payload(payload)
    except (RuntimeError, KeyError, TypeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise ContextualBertError(f"{path}: not a valid checkpoint ({exc})") from None
    return model.to(map_location).eval(), payload.get("meta", {})
