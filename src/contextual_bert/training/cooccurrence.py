"""Article embeddings from co-occurrence: the training outfits' positive PMI, factorised (`train.init_embeddings`).

Why: on sparse data (planted data, 3,000 articles, ~100 sightings each) the four-block encoder stays at the
popularity solution for many epochs: its random article embeddings carry no signal, the blocks learn to damp
what the other items add, and then no gradient teaches the embeddings (docs/training.md, the learning curve).
Starting the embeddings where item2vec / GloVe-style co-occurrence puts them removes that trap: articles that
share outfits start close, so the other items are informative from the first step.

    PPMI[a, b] = max(0, log(n_ab * N / (n_a * n_b)))  over pairs of distinct articles of one outfit
    E[a] = U[a, :d] * sqrt(S[:d])                         (truncated SVD of the symmetric PPMI)

rescaled to the table's own standard deviation, so the model starts at the scale it was built for. Articles
without a positive-PMI pair in the training outfits keep their random rows. Deterministic: the SVD is exact for
vocabularies up to DENSE_SVD_MAX_ITEMS, randomised (fixed seed, the caller's random stream untouched) beyond.
"""

from __future__ import annotations

import torch

from contextual_bert.data.feature_spec import N_SPECIAL

DENSE_SVD_MAX_ITEMS = 4096  # a dense float64 PPMI of this many rows is 128 MiB
SVD_SEED = 0


def pair_counts(items: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Sparse (n_rows, n_rows) counts of distinct article pairs within an outfit, both orders.

    items: (outfits, max_set_size) indices; only real articles below n_rows count (padding, [MASK], [UNK]
    and catalogue articles without an id row do not)."""
    real = (items >= N_SPECIAL) & (items < n_rows)
    a = items.unsqueeze(2).expand(-1, -1, items.shape[1])
    b = items.unsqueeze(1).expand(-1, items.shape[1], -1)
    keep = real.unsqueeze(2) & real.unsqueeze(1) & (a != b)
    index = torch.stack([a[keep], b[keep]])
    values = torch.ones(index.shape[1], dtype=torch.float64)
    return torch.sparse_coo_tensor(index, values, (n_rows, n_rows), check_invariants=True).coalesce()


def ppmi(counts: torch.Tensor) -> torch.Tensor:
    """The positive pointwise mutual information of sparse symmetric pair counts (zeros dropped)."""
    index, n_ab = counts.indices(), counts.values()
    n_a = torch.zeros(counts.shape[0], dtype=torch.float64).index_add_(0, index[0], n_ab)
    pmi = torch.log(n_ab * n_ab.sum() / (n_a[index[0]] * n_a[index[1]]))
    keep = pmi > 0
    return torch.sparse_coo_tensor(index[:, keep], pmi[keep], counts.shape, check_invariants=True).coalesce()


def cooccurrence_embeddings(items: torch.Tensor, n_rows: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_rows, dim) rows U * sqrt(S) of the PPMI's truncated SVD, and a (n_rows,) mask of the rows that
    have at least one positive-PMI pair (the others are zero)."""
    matrix = ppmi(pair_counts(items, n_rows))
    has_pairs = torch.zeros(n_rows, dtype=torch.bool)
    has_pairs[matrix.indices()[0]] = True
    k = min(dim, n_rows)
    if n_rows <= DENSE_SVD_MAX_ITEMS:
        u, s, _ = torch.linalg.svd(matrix.to_dense())
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SVD_SEED)
            u, s, _ = torch.svd_lowrank(matrix, q=min(k + 10, n_rows), niter=4)
    rows = torch.zeros(n_rows, dim, dtype=torch.float64)
    rows[:, :k] = u[:, :k] * s[:k].clamp(min=0).sqrt()
    rows[~has_pairs] = 0.0
    return rows, has_pairs


@torch.no_grad()
def init_from_cooccurrence(model: torch.nn.Module, items: torch.Tensor) -> int:
    """Overwrite the rows of the model's article-id embedding tables (`item_embeddings`, and a bag of items'
    `output_embeddings`) that have co-occurrence pairs in `items`; returns how many rows were set."""
    tables = [
        t for t in (getattr(model, "item_embeddings", None), getattr(model, "output_embeddings", None)) if t is not None
    ]
    n_rows, dim = tables[0].weight.shape
    rows, has_pairs = cooccurrence_embeddings(items, n_rows, dim)
    if not bool(has_pairs.any()):
        return 0
    for table in tables:
        target_std = table.weight[N_SPECIAL:].std()
        scaled = rows[has_pairs] * (target_std / rows[has_pairs].std()).double()
        table.weight[has_pairs] = scaled.to(table.weight.dtype)
    return int(has_pairs.sum())
