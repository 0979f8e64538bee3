"""`auto` for the sparse-data recipe (train.init_output, train.rare_id_decay): decided from the training split's
counts. On data where most articles are seen once or twice a model started at a zero bias learns those articles'
outfits by heart and ends below the count; started at the count, with the rare ids decayed, it ends above it
(the closets study). On dense data the same recipe leaves [None] stuck on the planted hidden tastes, so `auto`
turns it on only where the training split is sparse (docs/decisions.md)."""

from __future__ import annotations

import numpy as np
import torch

from contextual_bert.config import TrainConfig
from contextual_bert.data.feature_spec import N_SPECIAL

RARE_COUNT = 2  # an article seen at most this often in the training outfits is rare
SPARSE_RARE_ID_DECAY = 5.0  # rare_id_decay's value in the recipe (the closets study's)


def rare_share(items: torch.Tensor) -> float:
    """The share of the articles in the training outfits `items` (id or catalogue indices) seen at most
    RARE_COUNT times."""
    real = items[items >= N_SPECIAL]
    counts = np.bincount(real.cpu().numpy()) if len(real) else np.zeros(0, dtype=np.int64)
    seen = counts[counts > 0]
    return float((seen <= RARE_COUNT).mean()) if len(seen) else 0.0


def resolve(cfg: TrainConfig, items: torch.Tensor) -> tuple[TrainConfig, dict | None]:
    """`cfg` with `auto` replaced by the recipe's value (sparse: more than cfg.sparse_share of the articles of the
    training outfits `items` rare) or the dense default; and what was decided, for the run's metrics (None:
    nothing was auto)."""
    auto = [name for name in ("init_output", "rare_id_decay") if getattr(cfg, name) == "auto"]
    if not auto:
        return cfg, None
    share = rare_share(items)
    sparse = share > cfg.sparse_share
    values = {"init_output": "counts" if sparse else "random", "rare_id_decay": SPARSE_RARE_ID_DECAY if sparse else 0.0}
    chosen = {name: values[name] for name in auto}
    decision = {"rare_share": round(share, 4), "sparse_share": cfg.sparse_share, "sparse": sparse, **chosen}
    return cfg.model_copy(update=chosen), decision
