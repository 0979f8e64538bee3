"""`auto` for the sparse-data recipe (training/sparse.py): decided from the training outfits' counts, written to
the run's metrics, and the same run as an explicit setting would be."""

import json

import pytest
import torch

from contextual_bert.config import ModelConfig, TrainConfig
from contextual_bert.data.feature_spec import N_SPECIAL, PAD_INDEX, ContextSpec, EncodedOutfits
from contextual_bert.model import build_model
from contextual_bert.training import fit
from contextual_bert.training.sparse import RARE_COUNT, SPARSE_RARE_ID_DECAY, rare_share, resolve

SMALL = ModelConfig(d_model=16, n_blocks=1, n_heads=2, d_ff=32)


def outfits(n_articles: int, sightings: int, n_outfits: int, seed: int = 0) -> torch.Tensor:
    """(n_outfits, 4) outfits over n_articles articles, each article about `sightings` times."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.arange(n_articles).repeat(sightings)[torch.randperm(n_articles * sightings, generator=g)]
    items = torch.full((n_outfits, 4), PAD_INDEX)
    items.view(-1)[: min(len(pool), items.numel())] = pool[: items.numel()] + N_SPECIAL
    return items


def test_rare_share_counts_the_articles_seen_at_most_twice_among_those_seen():
    items = torch.tensor([[3, 4, 4, PAD_INDEX], [4, 5, 5, 5], [6, PAD_INDEX, PAD_INDEX, PAD_INDEX]])
    # 3: once, 4: three times, 5: three times, 6: once (7, 8, ... never seen: not counted)
    assert rare_share(items) == pytest.approx(2 / 4)
    assert RARE_COUNT == 2


def test_auto_is_the_recipe_on_sparse_data_and_the_dense_default_elsewhere():
    sparse, dense = outfits(400, 1, 100), outfits(20, 20, 100)
    cfg = TrainConfig()  # params.yaml's defaults: init_output and rare_id_decay auto
    on, said = resolve(cfg, sparse)
    assert (on.init_output, on.rare_id_decay) == ("counts", SPARSE_RARE_ID_DECAY)
    assert said == {"rare_share": 1.0, "sparse_share": cfg.sparse_share, "sparse": True, "init_output": "counts",
                    "rare_id_decay": SPARSE_RARE_ID_DECAY}  # fmt: skip
    off, said = resolve(cfg, dense)
    assert (off.init_output, off.rare_id_decay, said["sparse"]) == ("random", 0.0, False)
    # an explicit setting is kept, and only the other one decided
    kept, said = resolve(cfg.model_copy(update={"init_output": "random"}), sparse)
    assert (kept.init_output, kept.rare_id_decay) == ("random", SPARSE_RARE_ID_DECAY) and "init_output" not in said
    assert resolve(cfg.model_copy(update={"init_output": "random", "rare_id_decay": 0.0}), sparse) == (
        cfg.model_copy(update={"init_output": "random", "rare_id_decay": 0.0}),
        None,
    )


@pytest.mark.parametrize("explicit", [{"init_output": "counts", "rare_id_decay": SPARSE_RARE_ID_DECAY},
                                      {"init_output": "random", "rare_id_decay": 0.0}])  # fmt: skip
def test_an_auto_run_is_the_run_of_what_it_decided(tmp_path, explicit):
    """auto on sparse data trains exactly as the recipe set by hand, on dense data as the defaults before auto;
    the metrics say what was decided."""
    sightings = 1 if explicit["init_output"] == "counts" else 12
    train = EncodedOutfits(outfits(60, sightings, 60 * sightings // 4))
    val = EncodedOutfits(outfits(60, 2, 30, seed=1))
    cfg = TrainConfig(max_epochs=2, batch_size=8, lr_warmup_steps=2, validation_outfits=0, num_threads=1)
    results = {}
    for name, run_cfg in (("auto", cfg), ("explicit", cfg.model_copy(update=explicit))):
        torch.manual_seed(0)
        model = build_model(SMALL, "none", 60 + N_SPECIAL, ContextSpec([]))
        metrics = fit(model, train, val, run_cfg, tmp_path / name, seed=0)
        results[name] = (metrics, [p.detach().clone() for p in model.parameters()])
    (auto, auto_weights), (hand, hand_weights) = results["auto"], results["explicit"]
    assert all(torch.equal(a, b) for a, b in zip(auto_weights, hand_weights))
    assert auto["best_val_cross_entropy"] == hand["best_val_cross_entropy"]
    assert auto["sparse_recipe"]["sparse"] == (explicit["init_output"] == "counts")
    assert "sparse_recipe" not in hand
    assert json.loads((tmp_path / "auto" / "metrics.json").read_text())["sparse_recipe"] == auto["sparse_recipe"]
