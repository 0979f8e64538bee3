"""Issue 45: how soon does an encoder that can read the outfit show it? The outfit dependence on validation
(training.stuck_check, the measure behind Table 1's **stuck**) after each of a run's first epochs, then the run stops:
what train.bag_warmup_check_steps was chosen from (docs/encoder_recipe.md).

One model trained in process on a data project's features (as studies/encoder_recipe/encoder_screen.py), with params.yaml's
32-epoch schedule and `--set` overrides; one JSON line per epoch on stdout (epoch, steps so far, validation
cross-entropy, outfit dependence).

    python studies/encoder_recipe/stuck_check.py --data /tmp/encoder_recipe/planted_hidden_20000/data --model none \
        --epochs 4 --out /tmp/stuck/p20 --set train.num_threads=1 train.bag_warmup_epochs=0
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from contextual_bert import training  # noqa: E402
from contextual_bert.config import Config  # noqa: E402
from studies.project import override  # noqa: E402


class Enough(Exception):
    """Raised after --epochs epochs: the run's later epochs are not needed."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a data project (its params.yaml)")
    parser.add_argument("--model", default="none", help="any model name (train.models)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True, help="the run's folder")
    parser.add_argument("--set", nargs="*", default=[])
    args = parser.parse_args()

    params = yaml.safe_load((args.data / "params.yaml").read_text())
    for assignment in args.set:
        override(params, assignment)
    cfg = Config.model_validate(params)
    train_cfg, model_cfg = cfg.train_for(args.model), cfg.model_for(args.model)
    features = Path(params["paths"]["features_dir"])
    model, train_data, val_data = training.model_and_splits(features, args.model, args.seed, model_cfg, train_cfg)
    steps = math.ceil(len(train_data) / train_cfg.batch_size)

    def on_epoch_end(epoch: int, row: dict) -> None:
        check = training.stuck_check(model, val_data, 1024, next(model.parameters()).device, epoch)
        print(json.dumps({"variant": args.model, "seed": args.seed, "epoch": epoch, "steps": epoch * steps,
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
