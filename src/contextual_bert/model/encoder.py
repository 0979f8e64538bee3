"""Contextual BERT (Denk & Peleteiro Ramallo, 2020): a BERT encoder over a *set* of articles, conditioned on
a customer context vector c in one of the paper's five ways, or in two of ours.

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
    global_state_two_way [GS2] [GSU], and before its FFN the update also attends over the previous block's
                               outputs: the outfit writes to the state as well as reading it (not in the paper)
    adaptive_norm        [AdaLN] adaLN-Zero (DiT, Peebles & Xie 2023): c regresses each block's LayerNorm scales
                               and shifts and a gate on each sublayer's output, the gate from 0 (not in the paper)

The output layer is tied to the article embeddings (as in BERT), with a per-article bias, and is evaluated
only at the positions to predict (head.ArticleHead, scores.OutfitModel). What the paper does not have plugs in from outside
this module: article vectors from attributes (articles.py), and the readers (readers.py) at two seams, terms
added to the head state and offsets added to the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from contextual_bert.config import VARIANTS, ModelConfig, base_model
from contextual_bert.data.feature_spec import N_SPECIAL, PAD_INDEX, ContextSpec
from contextual_bert.errors import ContextualBertError
from contextual_bert.model.context import ContextEmbedding
from contextual_bert.model.dropout import Dropout
from contextual_bert.model.head import ArticleHead, ArticleVectors
from contextual_bert.model.readers import other_articles_mean
from contextual_bert.model.scores import OutfitModel

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


GLOBAL_STATE_VARIANTS = ("global_state", "global_state_update", "global_state_two_way")  # every block reads c~
STATE_UPDATE_VARIANTS = ("global_state_update", "global_state_two_way")  # c~ is updated between blocks
ADAPTIVE_NORM = "adaptive_norm"  # [AdaLN]: c modulates every block's norms and gates its sublayers
N_MODULATIONS = 6  # per block: shift, scale and gate of the attention sublayer, then of the FFN sublayer


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


def per_position(x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """One vector per outfit (B, d) at every position: (1, B, d) against (L, B, d), or (M, d) at the positions
    of outfits `rows`."""
    return x.unsqueeze(0) if rows is None else x[rows]


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
        b = per_position(self.value(global_state), rows)  # one per outfit, the same for all its positions
        # Dropout after broadcasting: each position gets its own mask, as dropout on any other sublayer
        # output does (one mask per outfit would silence the same units of c~ at all its positions).
        return self.norm(self.dropout(b, a_hat))


class AdaptiveModulation(nn.Module):
    """[AdaLN] a block's shifts, scales and gates from the condition z = W_c c (B, d), as DiT's adaLN-Zero:
    Linear(SiLU(z)) -> 6 x (B, d), weights and bias at zero, so every shift, scale and gate starts at 0 whatever c
    is. The bias is the unconditioned part (the norms have no affine parameters of their own, as in DiT)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.linear = nn.Linear(d_model, N_MODULATIONS * d_model)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, condition: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.linear(F.silu(condition)).chunk(N_MODULATIONS, dim=-1)


class Block(nn.Module):
    """One post-norm Transformer block (as in BERT), with the [GS] sublayer between attention and FFN, or
    [AdaLN]'s modulation of its norms and gates on its sublayers.

    [AdaLN] on a post-norm block. DiT's pre-norm block is x + a * F((1 + s) * LN(x) + b): the norm's gain and bias
    regressed from c, a gate a on the sublayer's output before the residual sum. Here each sublayer's LayerNorm
    comes after its residual sum, so the same three act there: LN(x + a * Dropout(F(x))) * (1 + s) + b, the norm
    without its own affine parameters (the regression's bias is its gain and bias), once for attention and once
    for the FFN. With a = s = b = 0 (the zero start) a block is LN(LN(x)): the post-norm identity (the input of
    blocks 2..n is already normalised; block 1 normalises the scaled embeddings), and nothing reads c. Unlike
    pre-norm, the scaled and shifted output is also the next sublayer's residual: in post-norm the norm's output
    is the residual stream.
    """

    def __init__(self, cfg: ModelConfig, global_state: bool, adaptive: bool = False):
        super().__init__()
        self.attention = MultiHeadSelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.attention_norm = nn.LayerNorm(cfg.d_model, elementwise_affine=not adaptive)
        self.global_state_attention = GlobalStateAttention(cfg.d_model, cfg.dropout) if global_state else None
        self.feed_forward = FeedForward(cfg.d_model, cfg.d_ff)
        self.feed_forward_norm = nn.LayerNorm(cfg.d_model, elementwise_affine=not adaptive)
        self.dropout = Dropout(cfg.dropout)
        self.modulation = AdaptiveModulation(cfg.d_model) if adaptive else None

    def forward(self, h, key_bias, global_state=None, select=None, condition=None):
        """(L, B, d) -> (L, B, d); with `select` (bool, (B, L)) only those positions come out, (M, d) in
        row-major (B, L) order, and everything after attention is computed for them alone. `condition`:
        [AdaLN]'s z (B, d)."""
        residual, rows = (h, None) if select is None else (h.transpose(0, 1)[select], select.nonzero()[:, 0])
        if self.modulation is not None:
            shift_1, scale_1, gate_1, shift_2, scale_2, gate_2 = (
                per_position(m, rows) for m in self.modulation(condition)
            )
            a_hat = self.attention_norm(self.dropout(gate_1 * self.attention(h, key_bias, select), residual))
            a_hat = torch.addcmul(shift_1, a_hat, 1 + scale_1)
            out = self.feed_forward_norm(self.dropout(gate_2 * self.feed_forward(a_hat), a_hat))
            return torch.addcmul(shift_2, out, 1 + scale_2)
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
    """[GSU] c~(l+1) = c~(l) + Dropout(g * Norm(FFN(c~(l))) + b), between two blocks ([GS2]: after its read of
    the outfit, GlobalStateRead); weights not shared.

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


class StateAttention(MultiHeadSelfAttention):
    """[GS2] MultiHead(c~, H, H): the global state, the single query, attends over the positions of H (W^Q, W^K,
    W^V, W^O of its own, laid out as the blocks' attention); padded keys get no attention. Returns (B, d): one
    vector per outfit."""

    def forward(self, global_state: torch.Tensor, h: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """global_state: (B, d); h: (L, B, d), position-first as in the blocks; key_bias: (B, 1, 1, L)."""
        length, batch, d_model = h.shape

        def heads(x):  # (L, B, d) -> (B * heads, L, d_head), a view
            return x.view(length, batch * self.n_heads, self.d_head).transpose(0, 1)

        q = self.query(global_state).view(batch * self.n_heads, 1, self.d_head)
        k, v = heads(self.key(h)), heads(self.value(h))
        scores = torch.bmm(q, k.transpose(1, 2)).mul_(self.d_head**-0.5)  # (B * heads, 1, L)
        scores.view(batch, self.n_heads, 1, length).add_(key_bias)
        probs = torch.softmax(scores, dim=-1)
        return self.output(torch.bmm(self.dropout(probs), v).view(batch, d_model))


class GlobalStateRead(nn.Module):
    """[GS2] c~ + Dropout(g * Norm(MultiHead(c~, H, H)) + b): the state reads the previous block's outputs.

    The norm shapes the read only, with g = b = 0 at initialisation, as in GlobalStateUpdate: every read
    starts as the identity, so [GS2] starts out exactly as [GS] (and [GSU]), and a comparison with them
    measures what the outfit's writing to the state adds, not another start or another scale of the state.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention = StateAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.norm = nn.LayerNorm(cfg.d_model)  # g, b: the read's scale, learned from zero
        self.dropout = Dropout(cfg.dropout)
        nn.init.zeros_(self.norm.weight)

    def forward(self, global_state: torch.Tensor, h: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.norm(self.attention(global_state, h, key_bias)), global_state)


class ConcatInput(nn.Module):
    """[C] x_i = W [e_i; W_c c]: c projected to d_model, concatenated to every item embedding."""

    def __init__(self, d_context: int, d_model: int):
        super().__init__()
        self.context_projection = nn.Linear(d_context, d_model)
        self.projection = nn.Linear(2 * d_model, d_model)

    def forward(self, e: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        projected = self.context_projection(c).unsqueeze(1).expand(-1, e.shape[1], -1)
        return self.projection(torch.cat([e, projected], dim=-1))


class ContextualBert(OutfitModel):
    """The encoder over a set of article indices (PAD_INDEX-padded), one of the variants (VARIANTS)."""

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
        if base_model(name) not in VARIANTS:
            raise ContextualBertError(
                f"unknown encoder model '{name}' (one of {', '.join(VARIANTS)}, or one of them + '_attrs')"
            )
        if n_items <= N_SPECIAL:
            raise ContextualBertError(f"n_items {n_items} leaves no real article after {N_SPECIAL} special rows")
        self.model_cfg, self.name, self.spec = model_cfg, name, spec
        conditioning = base_model(name)  # the paper's variant; "_attrs" changes only the article vectors
        d, d_context = model_cfg.d_model, spec.d_context
        uses_context = conditioning != "none"
        if uses_context and d_context == 0:
            raise ContextualBertError(f"model '{name}' needs context features; the spec has none")

        self.item_embeddings = nn.Embedding(n_items, d, padding_idx=PAD_INDEX)  # row MASK_INDEX is [MASK]
        self.context_embedding = ContextEmbedding(spec, model_cfg) if uses_context else None
        self.concat_input = ConcatInput(d_context, d) if conditioning == "concat" else None
        self.context_position = nn.Linear(d_context, d) if conditioning == "new_position" else None
        global_state = conditioning in GLOBAL_STATE_VARIANTS
        self.global_state = GlobalState(d_context, d) if global_state else None
        adaptive = conditioning == ADAPTIVE_NORM
        self.adaptive_condition = nn.Linear(d_context, d) if adaptive else None  # [AdaLN]'s z = W_c c, shared
        self.embedding_dropout = Dropout(model_cfg.dropout)
        self.blocks = nn.ModuleList(Block(model_cfg, global_state, adaptive) for _ in range(model_cfg.n_blocks))
        # between two blocks: [GS2]'s read of the outfit, then the update of [GSU] and [GS2]; weights not shared
        self.global_state_reads = (
            nn.ModuleList(GlobalStateRead(model_cfg) for _ in range(model_cfg.n_blocks - 1))
            if conditioning == "global_state_two_way"
            else None
        )
        self.global_state_updates = (
            nn.ModuleList(GlobalStateUpdate(model_cfg) for _ in range(model_cfg.n_blocks - 1))
            if conditioning in STATE_UPDATE_VARIANTS
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
        self._init_attributes(name, n_items, attributes, combine)  # last: the paper's models draw as before
        self.articles = ArticleVectors(self.item_embeddings, self.attributes)
        self.output = ArticleHead(self.articles, self.output_bias)  # tied: it scores the input's article vectors

    # --- the encoder ---------------------------------------------------------------------------------

    def forward(
        self,
        items: torch.Tensor,
        context: dict[str, torch.Tensor] | None = None,
        select: torch.Tensor | None = None,
        *,
        states: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Hidden states (B, L, d_model) at the L item positions of `items` (B, L); or, given `select`
        (bool, (B, L)), (M, d_model) at those positions only, in row-major order. Only they are needed for
        a prediction, and the last block then computes just them after its attention. `states`, a list, gets
        the global state each block reads (global_states)."""
        c = self.context(context)
        x = self.article_vectors(items) * self.input_scale
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
        condition = self.adaptive_condition(c) if self.adaptive_condition is not None else None

        h = self.embedding_dropout(x)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            if i > 0 and self.global_state_reads is not None:  # h: the previous block's, at every position
                global_state = self.global_state_reads[i - 1](global_state, h, key_bias)
            if i > 0 and self.global_state_updates is not None:
                global_state = self.global_state_updates[i - 1](global_state)
            if states is not None and global_state is not None:
                states.append(global_state)
            h = block(h, key_bias, global_state, select if i == last else None, condition)
        if select is not None:
            return h
        return (h[1:] if self.context_position is not None else h).transpose(0, 1)

    def global_states(self, items: torch.Tensor, context: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """The global state c~ (B, d_model) that each block reads, in block order; [] for a variant without one."""
        states: list[torch.Tensor] = []
        self(items, context, states=states)
        return states

    def context(self, context: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
        """c, or None for [None]; a history is read through the article vectors at the input's scale."""
        if self.context_embedding is None:
            return None
        return self.context_embedding(context, lambda a: self.article_vectors(a) * self.input_scale)

    # --- the output layer, only where needed ---------------------------------------------------------

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head transform before the output layer: GELU(W h)."""
        return F.gelu(self.head_transform(hidden))
