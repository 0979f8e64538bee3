"""Article vectors from attributes: e_a from an article's id embedding and its attribute embeddings (a vector
attribute's projection among them), for every article of the catalogue (the "<model>_attrs" models)."""

from __future__ import annotations

import math

import torch
from torch import nn

from contextual_bert.data.feature_spec import N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX, VECTOR_KIND, ContextSpec, FeatureSpec
from contextual_bert.errors import ContextualBertError

ATTRIBUTE_COMBINES = ("sum", "concat")


class TextEmbedding(nn.EmbeddingBag):
    """A text attribute's vector (kind text: a product's name or description): the mean of its words'
    embeddings (feature_store.text_words; PAD-padded rows of word indices; an unseen word reads the UNKNOWN
    row, a text without words the MISSING row)."""

    def __init__(self, n_words: int, dim: int):
        super().__init__(n_words, dim, mode="mean", padding_idx=PAD_INDEX)


class VectorProjection(nn.Module):
    """A vector attribute's part of e_a (kind vector: CLIP's, a sentence embedding, the catalogue's TF-IDF;
    data/vectors.py): W x(a) + b, a learned linear projection of the article's vector; a learned vector of its
    own for an article without one (never dropped); zero for the special rows, as every attribute's PAD row.

    W starts at N(0, 1/d_model): the vectors arrive at a root-mean-square length of 1 (vectors.fit_vector), so
    W x starts at the id embeddings' scale."""

    def __init__(self, length: int, width: int, d_model: int):
        super().__init__()
        self.linear = nn.Linear(length, width)
        self.missing = nn.Parameter(torch.zeros(width))
        nn.init.normal_(self.linear.weight, std=d_model**-0.5)
        nn.init.zeros_(self.linear.bias)
        nn.init.normal_(self.missing, std=d_model**-0.5)

    def forward(self, vectors: torch.Tensor, special: torch.Tensor) -> torch.Tensor:
        """(m, width) of `vectors` (m, length), a NaN row for none; `special` (m,): the rows that are specials."""
        absent = torch.isnan(vectors).any(dim=-1, keepdim=True)
        projected = self.linear(torch.nan_to_num(vectors, nan=0.0))
        out = torch.where(absent, self.missing.to(projected.dtype), projected)
        return out.masked_fill(special.unsqueeze(-1), 0.0)


def attribute_embedding(feature: FeatureSpec, width: int, d_model: int) -> nn.Module:
    """The embedding table (a vector's projection) of one article attribute, by its kind."""
    if feature.kind == VECTOR_KIND:
        return VectorProjection(feature.max_values, width, d_model)
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

    The sum is the default (docs/decisions.md): fewer parameters, and an unseen article's vector stays a plain
    sum of trained attribute rows and the [UNK] row, where a projection mixes the id part into every article.

    Id dropout (`ids`, rate per_model.<model>_attrs.id_dropout, training mode only): each real article at an input
    position and each catalogue row of the output layer (with its bias) reads [UNK] instead of its id with that
    probability, so those articles must be recognised and ranked by their attributes, as an unseen one is at test
    time; without it the ids memorise the training outfits before the attributes learn anything, and [UNK] is
    never a target. Drawn per input position and per output row (independently), from the global generator as
    dropout is, so a resumed run repeats its draws. The rate: training.regularisers.id_dropout_rate.

    The catalogue's encoded attributes are buffers outside the state_dict (`set_catalogue`): the weights do
    not depend on how many articles there are, so a served model takes a larger catalogue without
    retraining. An article without an id embedding (index >= n_ids) reads the [UNK] id row. Multi-valued
    attributes are the mean of their values' embeddings, text the mean of its words' (TextEmbedding); missing /
    unknown values have their own rows. A vector attribute is a learned projection of the article's vector
    (VectorProjection), summed as any attribute is, so that an article unseen in training is ranked by its vector
    at the output as at the input.
    """

    id_rows: torch.Tensor  # a buffer (set_catalogue): each catalogue article's id row, [UNK] for one without an id

    def __init__(self, spec: ContextSpec, n_ids: int, d_model: int, combine: str = "sum"):
        super().__init__()
        if combine not in ATTRIBUTE_COMBINES:
            raise ContextualBertError(f"unknown attribute combine '{combine}' (one of {', '.join(ATTRIBUTE_COMBINES)})")
        if not spec.features:
            raise ContextualBertError("a model with article attributes needs at least one attribute")
        self.spec, self.n_ids, self.combine = spec, n_ids, combine
        self.id_dropout = 0.0  # a training setting (per_model.<model>_attrs.id_dropout; training.fit), not a weight
        # added to the logit of every article without an id outside training (unseen_offset below; in checkpoints)
        self.unseen_offset = 0.0
        widths = [d_model if combine == "sum" else f.dim for f in spec.features]
        self.embeddings = nn.ModuleList(attribute_embedding(f, w, d_model) for f, w in zip(spec.features, widths))
        for table in self.embeddings:
            if not isinstance(table, nn.Embedding | nn.EmbeddingBag):
                continue  # a VectorProjection: initialised as its own class says
            nn.init.normal_(table.weight, std=d_model**-0.5)
            with torch.no_grad():
                table.weight[PAD_INDEX].zero_()
        self.projection = nn.Linear(d_model + sum(widths), d_model) if combine == "concat" else None
        self.scale = (1 + len(spec.features)) ** -0.5
        self.set_catalogue({f.name: torch.zeros((n_ids, f.max_values) if f.is_list or f.kind == VECTOR_KIND
                                                else n_ids) for f in spec.features})  # fmt: skip

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
        device = next(self.embeddings.parameters()).device
        for f in self.spec.features:
            vector = f.kind == VECTOR_KIND
            values = attributes[f.name].to(device=device, dtype=torch.float32 if vector else torch.long)
            if len(values) != n:
                raise ContextualBertError(f"catalogue attribute {f.name!r} has {len(values)} rows, not {n}")
            if vector and (values.dim() != 2 or values.shape[1] != f.max_values):
                raise ContextualBertError(
                    f"catalogue vector {f.name!r} is of shape {tuple(values.shape)}, not (n, {f.max_values})"
                )
            if not vector and values.numel() and int(values.max()) >= f.cardinality:
                raise ContextualBertError(
                    f"catalogue attribute {f.name!r} holds index {int(values.max())}, "
                    f"beyond its {f.cardinality} embedding rows"
                )
            self.register_buffer(f"catalogue_{f.name}", values, persistent=False)
        rows = torch.arange(n, device=device)
        self.register_buffer("id_rows", rows.masked_fill(rows >= self.n_ids, UNKNOWN_INDEX), persistent=False)

    def catalogue(self) -> dict[str, torch.Tensor]:
        return {f.name: self.get_buffer(f"catalogue_{f.name}") for f in self.spec.features}

    def calibrate_unseen(self, share: float) -> float:
        """Set and return `unseen_offset` for the catalogue held now, the id dropout set and `share`, the validation
        targets' share without an id: log(s (p K + U) / (p U)), p the id dropout, K the articles with an id, U those
        without, s the share; log(1 + p K / U) for `auto` (p = s). Why: in training the [UNK]-read rows are the U
        articles without an id plus about p K dropped ones, and the dropped targets teach the model to give that
        group a mass of about p; outside training only the U rows read [UNK], and the group should get s. 0 (the
        same bits as without it) without id dropout, without articles lacking an id, or where s is 0."""
        known, unseen, p = self.n_ids - N_SPECIAL, self.n_items - self.n_ids, self.id_dropout
        useful = p > 0 and unseen > 0 and share > 0
        self.unseen_offset = math.log(share * (p * known + unseen) / (p * unseen)) if useful else 0.0
        return self.unseen_offset

    def bias(self, output_bias: torch.Tensor, ids: torch.Tensor, flat: torch.Tensor | None = None) -> torch.Tensor:
        """The output bias of the rows `ids` (from `ids(flat)`): the id rows' bias, plus `unseen_offset` for the
        catalogue rows without an id (index >= n_ids) outside training."""
        bias = output_bias[ids]
        if self.training or self.unseen_offset == 0.0:
            return bias
        rows = torch.arange(self.n_items, device=bias.device) if flat is None else flat
        return bias + (rows >= self.n_ids).to(bias.dtype) * self.unseen_offset

    def ids(self, flat: torch.Tensor | None = None) -> torch.Tensor:
        """The id rows of the article indices `flat` (1-d), or of the whole catalogue. In training mode, with
        id_dropout > 0, each real article's id row is replaced by [UNK] with that probability (one draw per
        row, from the global generator, as dropout's): the article is then seen as an unseen one would be."""
        ids = self.id_rows if flat is None else self.id_rows[flat]
        if self.training and self.id_dropout > 0:
            dropped = (torch.rand(ids.shape, device=ids.device) < self.id_dropout) & (ids >= N_SPECIAL)
            ids = ids.masked_fill(dropped, UNKNOWN_INDEX)
        return ids

    def forward(
        self, id_embeddings: nn.Embedding, articles: torch.Tensor | None = None, ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """e_a for the article indices `articles` (any shape; (..., d)), or for the whole catalogue (n, d);
        `ids`: the id rows to read (from `ids()`), when the caller needs them too (the output bias)."""
        flat = None if articles is None else articles.reshape(-1)
        ids = self.ids(flat) if ids is None else ids
        parts = [id_embeddings(ids)]
        for f, table in zip(self.spec.features, self.embeddings):
            values = self.get_buffer(f"catalogue_{f.name}")
            rows = values if flat is None else values[flat]
            if f.kind == VECTOR_KIND:  # the specials by their catalogue index, whatever id dropout read
                index = torch.arange(len(values), device=values.device) if flat is None else flat
                parts.append(table(rows, index < N_SPECIAL))
            else:
                parts.append(table(rows))
        if self.projection is not None:
            e = self.projection(torch.cat(parts, dim=-1))
        else:
            e = torch.stack(parts).sum(dim=0) * self.scale
        return e if articles is None else e.view(*articles.shape, -1)
