"""Issue 45's quick screen: one model trained in process on a data project's features (the projects that
studies/encoder_recipe/encoder_recipe.py builds under /tmp/encoder_recipe/<kind>/data), with overrides, printing a JSON row
per epoch (training cross-entropy measured as validation's, validation cross-entropy) and the geometry of the
article-id table (`common_share`: the frequency-weighted mean vector's share of the mean squared norm, high when
every article leans one way; `rms_norm`; the top singular values' share of the centred table). No evaluation
stage, no outfit dependence: a screen to choose what encoder_recipe.py then runs through the pipeline.

    python studies/encoder_recipe/encoder_screen.py --data /tmp/encoder_recipe/planted_hidden_50000/data --model none \
        --out /tmp/screen/outbag_wd3 --set train.max_epochs=8 model.bag_path=output train.weight_decay=0.3

`--set` takes params keys (project.override); a train.* key also replaces the model's own `per_model:` entry.
The warm-up from the bag is `--set train.bag_warmup_epochs=N` (the screen's `--bag-fade N` before it was a
setting, with one difference: the screen validated its warm-up epochs with the bag term, the setting without).
`--bag-aux W` (a candidate, not a setting): the training loss gains W x the cross-entropy of the bag of the
outfit's other articles scored through the model's own tied article vectors (`ContextualBert.bag_state`, the
same softmax, full or sampled), so the article table learns what co-occurs from the first step while the head
states stay the paper's encoder's; `--bag-aux-epochs N` fades W linearly to 0 over N epochs (0: kept). It no longer
runs: the models have no `bag_state` now, and the screen says so and stops.
`--collect DIR...` instead gathers the logs written as DIR/<name>.log into one JSON (stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from contextual_bert import training  # noqa: E402
from contextual_bert.config import Config  # noqa: E402
from contextual_bert.data import N_SPECIAL  # noqa: E402
from studies.project import override  # noqa: E402


def geometry(model, items: torch.Tensor) -> dict:
    table = model.item_embeddings.weight.detach()[N_SPECIAL:].double().cpu()  # (the training's device may be CUDA)
    seen = items.flatten().cpu()
    seen = seen[seen >= N_SPECIAL] - N_SPECIAL
    weight = torch.bincount(seen, minlength=len(table)).double()
    weight = weight / weight.sum()
    mean = (weight[:, None] * table).sum(0)
    mean_square = (weight * (table**2).sum(1)).sum()
    singular = torch.linalg.svdvals((table - mean) * weight.sqrt()[:, None]) ** 2
    return {
        "common_share": float(mean.dot(mean) / mean_square),
        "rms_norm": float(mean_square.sqrt()),
        "top1_share": float(singular[0] / singular.sum()),
        "top8_share": float(singular[:8].sum() / singular.sum()),
    }


def collect(folders: list[Path]) -> dict:
    out = {}
    for folder in folders:
        for log in sorted(folder.glob("*.log")):
            text = log.read_text()
            rows = [
                json.loads(line[line.index('{"epoch"') :])
                for line in text.replace("\r", "\n").splitlines()
                if '{"epoch"' in line
            ]
            settings = next(
                (json.loads(line[len("settings ") :]) for line in text.splitlines() if line.startswith("settings ")),
                None,
            )
            out[f"{folder.name}/{log.stem}"] = {
                "settings": settings,
                "epochs": rows,
                "best_val": min((r["val_cross_entropy"] for r in rows), default=None),
            }
    return out


def aux_weight(weight: float, epochs: int, epoch: int) -> float:
    """--bag-aux's weight in epoch `epoch` (1-based): `weight`, or with `epochs` > 0 falling from it to 0."""
    return weight if epochs == 0 else weight * max(0.0, 1.0 - (epoch - 1) / epochs)


def with_bag_auxiliary(loss_fn, weight: float, epochs: int, held: dict):
    """training.masked_item_loss plus the bag of items' loss through the model's tied vectors (training only)."""

    def loss(model, inputs, context, predict, items, sampler=None):
        main = loss_fn(model, inputs, context, predict, items, sampler)
        w = aux_weight(weight, epochs, held["epoch"])
        if w == 0 or not torch.is_grad_enabled() or not predict.any():
            return main
        states = model.bag_state(inputs, predict)
        targets = items[predict]
        if sampler is not None:
            bag = training.sampled_item_loss(model, states, targets, inputs, predict, sampler, context)
        else:
            bag = torch.nn.functional.cross_entropy(model.article_logits(states, None).float(), targets - N_SPECIAL)
        return main + w * bag

    return loss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--model", default="none", help="any model name (train.models)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[])
    parser.add_argument("--collect", nargs="*", type=Path)
    parser.add_argument("--bag-aux", type=float, default=0.0)
    parser.add_argument("--bag-aux-epochs", type=int, default=0)
    args = parser.parse_args()
    if args.collect:
        print(json.dumps(collect(args.collect), indent=1))
        return 0
    params = yaml.safe_load((args.data / "params.yaml").read_text())
    entry = params.setdefault("per_model", {}).setdefault(args.model, {})
    for assignment in args.set:
        override(params, assignment)
        section, _, key = assignment.partition("=")[0].partition(".")
        if section == "train" and key in entry:  # a study's setting wins over the model's own
            override(params, f"per_model.{args.model}.{assignment.partition('.')[2]}")
    cfg = Config.model_validate(params)
    train_cfg, model_cfg = cfg.train_for(args.model), cfg.model_for(args.model)
    print(
        "settings "
        + json.dumps(
            {
                "variant": args.model,  # the key the records so far have
                "seed": args.seed,
                "model": model_cfg.model_dump(),
                "train": train_cfg.model_dump(),
                "bag_aux": args.bag_aux,
                "bag_aux_epochs": args.bag_aux_epochs,
            }
        ),
        flush=True,
    )

    held, started = {"epoch": 1}, time.time()
    # the model and its training outfits, for geometry
    model, train_data, val_data = training.model_and_splits(
        Path(params["paths"]["features_dir"]), args.model, args.seed, model_cfg, train_cfg
    )
    if args.bag_aux > 0 and not hasattr(model, "bag_state"):
        raise SystemExit("--bag-aux scores the bag through ContextualBert.bag_state, which the models no longer have")
    loss = training.masked_item_loss
    if args.bag_aux > 0:
        loss = with_bag_auxiliary(loss, args.bag_aux, args.bag_aux_epochs, held)

    def on_epoch_end(epoch: int, row: dict) -> None:
        keep = ("train_loss", "train_cross_entropy", "val_cross_entropy", "seconds")
        bag_weight = row.get("bag_weight", 0.0)  # the weight this epoch trained with
        held["epoch"] = epoch + 1
        checked = {"outfit_dependence": round(row["outfit_dependence"], 4)} if "outfit_dependence" in row else {}
        print(
            json.dumps(
                {
                    "epoch": epoch,
                    "bag_weight": bag_weight,
                    "bag_aux": aux_weight(args.bag_aux, args.bag_aux_epochs, epoch),
                    **{k: round(row[k], 4) for k in keep},
                    **checked,
                    **geometry(model, train_data.items),
                    "t": round(time.time() - started),
                }
            ),
            flush=True,
        )

    with training.step_loss(loss):  # train_step's loss: masked_item_loss itself without --bag-aux
        metrics = training.fit(model, train_data, val_data, train_cfg, args.out, args.seed, on_epoch_end)
    print(json.dumps(metrics), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
