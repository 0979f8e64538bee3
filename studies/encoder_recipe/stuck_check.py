"""Issue 45: how soon does an encoder that can read the outfit show it? The outfit dependence on validation
(training.stuck_check, the measure behind Table 1's **stuck**) after each of a run's first epochs, then the run stops:
what train.bag_warmup_check_steps was chosen from (docs/encoder_recipe.md).

One model trained in process on a data project's features (as studies/encoder_recipe/encoder_screen.py), with params.yaml's
32-epoch schedule and `--set` overrides; one JSON line per epoch on stdout (epoch, steps so far, validation
cross-entropy, outfit dependence).

    python studies/encoder_recipe/stuck_check.py --data /tmp/encoder_recipe/planted_hidden_20000/data --variant none \
        --epochs 4 --out /tmp/stuck/p20 --set train.num_threads=1 train.bag_warmup_epochs=0
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from contextual_bert import training  # noqa: E402
from contextual_bert.config import Config, ModelConfig, TrainConfig, uses_attributes  # noqa: E402
from contextual_bert.data import EncodedOutfits, load_article_vocab, load_catalogue, load_spec, load_split  # noqa: E402
from contextual_bert.model import OutfitModel, build_model  # noqa: E402
from studies.project import override  # noqa: E402


class Enough(Exception):
    """Raised after --epochs epochs: the run's later epochs are not needed."""


def built_run(
    features: Path, variant: str, seed: int, model_cfg: ModelConfig, train_cfg: TrainConfig
) -> tuple[OutfitModel, EncodedOutfits, EncodedOutfits]:
    """The model and its training and validation splits as training.train builds them before its `fit` (the
    model seeded, an `_attrs` model's catalogue set, the co-occurrence start where train.init_embeddings says so):
    the screens hold the model to measure it after each epoch, so they call training.fit themselves."""
    spec = load_spec(features)
    n_items = len(load_article_vocab(features))
    catalogue = load_catalogue(features) if uses_attributes(variant) else None
    train_data = load_split(features, "train", model_cfg.max_set_size, catalogue=catalogue is not None)
    val_data = load_split(features, "val", model_cfg.max_set_size, catalogue=catalogue is not None)
    torch.manual_seed(seed)
    model = build_model(model_cfg, variant, n_items, spec, None if catalogue is None else catalogue.spec)
    if catalogue is not None:
        model.set_catalogue(catalogue.tensors())
    if train_cfg.init_embeddings == "cooccurrence":
        training.init_from_cooccurrence(model, train_data.items)
    return model, train_data, val_data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a data project (its params.yaml)")
    parser.add_argument("--variant", default="none")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True, help="the run's folder")
    parser.add_argument("--set", nargs="*", default=[])
    args = parser.parse_args()

    params = yaml.safe_load((args.data / "params.yaml").read_text())
    for assignment in args.set:
        override(params, assignment)
    cfg = Config.model_validate(params)
    train_cfg, model_cfg = cfg.train_for(args.variant), cfg.model_for(args.variant)
    features = Path(params["paths"]["features_dir"])
    model, train_data, val_data = built_run(features, args.variant, args.seed, model_cfg, train_cfg)
    steps = math.ceil(len(train_data) / train_cfg.batch_size)

    def on_epoch_end(epoch: int, row: dict) -> None:
        check = training.stuck_check(model, val_data, 1024, next(model.parameters()).device, epoch)
        print(json.dumps({"variant": args.variant, "seed": args.seed, "epoch": epoch, "steps": epoch * steps,
                          "val_cross_entropy": round(row["val_cross_entropy"], 4),
                          "dependence": round(check["outfit_dependence"], 4)}), flush=True)  # fmt: skip
        if epoch >= args.epochs:
            raise Enough

    try:
        training.fit(model, train_data, val_data, train_cfg, args.out, args.seed, on_epoch_end)
    except Enough:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
