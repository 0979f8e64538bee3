"""The article head, by composition: the articles' vectors (an id table and, for the "_attrs" models, their
attributes: `ArticleVectors`) and the output layer over the catalogue that scores head states against them, with a
bias per article id (`ArticleHead`). ContextualBert's head is tied: its output layer scores the input's article
vectors; the bag of items' has vectors of its own.

Neither object owns a weight: the id tables, the bias and the attribute embeddings stay submodules of the model,
registered where and as they were, so that checkpoints keep their keys and the parameters their order (the order
in which the gradient norm is summed for clipping: another order rounds it otherwise, and a training's bits move).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from contextual_bert.model.articles import ArticleAttributes

OutputLayer = tuple[torch.Tensor, torch.Tensor]  # (weight (n, d), bias (n,))


class ArticleVectors:
    """e_a for the articles of the catalogue: the id table's rows, or (with `attributes`) the id and attribute
    embeddings combined (ArticleAttributes); the articles scored are then the catalogue's, the first n_ids of them
    with an id of their own."""

    def __init__(self, ids: nn.Embedding, attributes: ArticleAttributes | None):
        self.ids, self.attributes = ids, attributes

    @property
    def n_ids(self) -> int:
        return self.ids.num_embeddings

    @property
    def n_items(self) -> int:
        """Articles scored: the catalogue's with attributes, else the id vocabulary's (specials included)."""
        return self.n_ids if self.attributes is None else self.attributes.n_items

    def __call__(self, articles: torch.Tensor | None = None) -> torch.Tensor:
        """The vectors of `articles` (any shape; (..., d)) or of every article (n, d)."""
        if self.attributes is not None:
            return self.attributes(self.ids, articles)
        return self.ids.weight if articles is None else self.ids(articles)


class ArticleHead:
    """The output layer: (weight, bias) over every article from `vectors` and the per-id `bias` (`layer`), and the
    logits over the real articles. An article without an id (or whose id is dropped in this step) shares the [UNK]
    row's bias: one draw of `ArticleAttributes.ids()` serves both; outside training an article without an id gets
    the calibration offset too (ArticleAttributes.calibrate_unseen).

    A pass that scores the whole catalogue many times (validation, evaluation, FITB, serving) holds the layer built
    once (`hold`, `catalogue_pass`): for the "_attrs" models, the vectors of every catalogue article and their bias,
    which each call would otherwise build again. Eval mode and no gradient only: in training the layer is built
    every step (its id dropout draws)."""

    def __init__(self, vectors: ArticleVectors, bias: nn.Parameter):
        self.vectors, self.bias = vectors, bias
        self.held: OutputLayer | None = None  # hold's (weight, bias): not a weight, not in the state_dict

    @property
    def training(self) -> bool:
        """The model's mode, as its id table has it (model.train() and eval() set every submodule's)."""
        return self.vectors.ids.training

    def layer(self, articles: torch.Tensor | None = None) -> OutputLayer:
        """(weight (n_items, d), bias (n_items,)) over every article, or (C, d), (C,) for the catalogue indices
        `articles` (C,) only: the sampled softmax's candidates, whose attribute vectors are then the only ones
        built."""
        attributes = self.vectors.attributes
        if attributes is None:
            if articles is None:
                return self.vectors.ids.weight, self.bias
            return self.vectors.ids.weight.index_select(0, articles), self.bias.index_select(0, articles)
        ids = attributes.ids(articles)
        return attributes(self.vectors.ids, articles, ids=ids), attributes.bias(self.bias, ids, articles)

    def catalogue(self) -> OutputLayer:
        """The layer over every article: the held one when a pass holds it (eval mode, no gradient), else `layer()`.
        The same tensors either way."""
        if self.held is not None and not self.training and not torch.is_grad_enabled():
            return self.held
        return self.layer()

    def held_vectors(self, side: ArticleVectors, articles: torch.Tensor) -> torch.Tensor | None:
        """The vectors of `articles` on the article side `side`, read from the held layer where it holds these very
        vectors (the layer tied to `side`, the attributes summed, each row on its own: the same numbers), so that a
        pass does not build them again for every outfit and history article; else None."""
        if self.held is None or side is not self.vectors or self.training or torch.is_grad_enabled():
            return None
        if side.attributes is not None and side.attributes.combine != "sum":
            return None
        return self.held[0][articles]

    def hold(self) -> bool:
        """Build the layer over the whole catalogue now and score every later call without gradient in eval mode
        with it, until `release`. Nothing in training mode (the id dropout draws anew every step). Returns whether
        it built one (False: one was held already, or training mode). The weights must not change while it is
        held (a pass, a served model)."""
        if self.training or self.held is not None:
            return False
        with torch.no_grad():
            weight, bias = self.layer()
        self.held = (weight.detach(), bias.detach())
        return True

    def release(self) -> None:
        self.held = None

    @contextmanager
    def catalogue_pass(self) -> Iterator[None]:
        """The body as one pass over the catalogue: the layer built once (`hold`), released after; within an
        enclosing pass, that one's."""
        built = self.hold()
        try:
            yield
        finally:
            if built:
                self.release()
