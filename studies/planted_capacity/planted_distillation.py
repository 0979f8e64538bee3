"""Can the encoder compute the planted optimum? The model trained on the optimum's own distributions.

A trained model misses the optimum for two reasons: what its architecture can express, and what it learns
from the training outfits, each case telling it one sampled article. This benchmark takes the second away.
It trains a model of the project (`model.build_model`, the pipeline's optimizer and schedule) on the same
training outfits, but each case's target is the optimum's whole distribution P(. | other items[, context])
(`optimum.py`), and the loss is KL(P || Q), the expected excess cross-entropy over the optimum. One position
of every outfit is masked per epoch, drawn afresh.

Its validation KL is then what the architecture, given the best possible teacher on this many outfits,
still misses; the test cross-entropy on the real targets beside the optimum's is the gap the learning curve
reports, measured the same way (`evaluation.evaluate_split`, the same cases). A gap far below the trained
model's says the architecture is not what holds it back; a gap near it says it is.

    python studies/planted_capacity/planted_distillation.py --project <planted project> --model none_attrs --epochs 4 \
        --run distillation_none_attrs_4epochs
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from contextual_bert.config import EvaluateConfig, ModelConfig, TrainConfig, base_model, uses_attributes
from contextual_bert.data import (
    MASK_INDEX,
    N_SPECIAL,
    PAD_INDEX,
    UNKNOWN_INDEX,
    load_article_vocab,
    load_catalogue,
    load_spec,
    load_split,
)
from contextual_bert.errors import ContextualBertError
from contextual_bert.evaluation import evaluate_split, optimum_from_features
from contextual_bert.model import build_model
from contextual_bert.training import lr_factor, make_optimizer

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.learning_curve.learning_curve import CONTEXT_FREE  # noqa: E402
from studies.project import record  # noqa: E402


def mask_one(items: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(the outfits with one known article each, drawn uniformly, replaced by [MASK]; which rows were kept):
    outfits without a known article are dropped."""
    known = (items != PAD_INDEX) & (items != UNKNOWN_INDEX)
    keep = known.any(1)
    items, known = items[keep], known[keep]
    pick = torch.multinomial(known.float(), 1, generator=generator)[:, 0]
    masked = items.clone()
    masked[torch.arange(len(items)), pick] = MASK_INDEX
    return masked, keep


def kl_to_teacher(model, teacher, masked: torch.Tensor, context: dict) -> torch.Tensor:
    """Mean KL(P || Q) over the rows, P the optimum's distribution at the [MASK], Q the model's."""
    with torch.no_grad():
        log_p = teacher.masked_logits(masked, context)[:, N_SPECIAL:].float()
    log_q = torch.log_softmax(model.masked_logits(masked, context)[:, N_SPECIAL:].float(), dim=1)
    p = log_p.exp()
    return (p * (log_p - log_q)).masked_fill(p == 0, 0.0).sum(1).mean()


def mean_kl(model, teacher, data, batch: int, generator: torch.Generator) -> float:
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(data.items), batch):
            masked, keep = mask_one(data.items[start : start + batch], generator)
            context = {k: v[start : start + batch][keep] for k, v in data.context.items()}
            total += float(kl_to_teacher(model, teacher, masked, context)) * len(masked)
            n += len(masked)
    model.train()
    return total / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True, help="a planted project (data/raw, data/features)")
    parser.add_argument("--run", required=True, help="the run's key in the results file")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).with_name("results.json"),
        help="the results file (default: the study's results.json)",
    )
    parser.add_argument("--model", default="none_attrs", help="any model name (train.models)")
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    raw, features = args.project / "data/raw", args.project / "data/features"
    with_context = base_model(args.model) not in CONTEXT_FREE
    teacher = optimum_from_features(raw, features, with_context)
    vocab = load_article_vocab(features)
    catalogue = load_catalogue(features) if uses_attributes(args.model) else None
    # the model and the optimum must score the same index space (then both read the same encoded outfits)
    if catalogue is not None and list(catalogue.vocab.ids) != list(vocab.ids):
        raise ContextualBertError(
            f"{features}: the catalogue's articles ({len(catalogue.vocab)}) are not the train "
            f"vocabulary's ({len(vocab)}) in its order; the optimum scores the vocabulary only"
        )
    max_set_size = ModelConfig().max_set_size
    train, val, test = (
        load_split(features, s, max_set_size, catalogue=catalogue is not None) for s in ("train", "val", "test")
    )
    torch.manual_seed(args.seed)
    model_cfg = ModelConfig(dropout=args.dropout)
    train_cfg = TrainConfig(learning_rate=args.learning_rate, max_epochs=args.epochs, batch_size=args.batch_size)
    model = build_model(
        model_cfg, args.model, len(vocab), load_spec(features), None if catalogue is None else catalogue.spec
    )
    if catalogue is not None:
        model.set_catalogue(catalogue.tensors())
    steps_per_epoch = -(-len(train.items) // args.batch_size)
    optimizer = make_optimizer(model, train_cfg, torch.device("cpu"))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(train_cfg, steps_per_epoch * args.epochs))
    generator = torch.Generator().manual_seed(args.seed)
    history, started = [], time.time()
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(train.items), generator=generator)
        running = 0.0
        for step in range(steps_per_epoch):
            rows = order[step * args.batch_size : (step + 1) * args.batch_size]
            masked, keep = mask_one(train.items[rows], generator)
            context = {k: v[rows][keep] for k, v in train.context.items()}
            loss = kl_to_teacher(model, teacher, masked, context)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip, foreach=True)
            optimizer.step()
            scheduler.step()
            running += float(loss)
        row = {
            "epoch": epoch,
            "train_kl": running / steps_per_epoch,
            "val_kl": mean_kl(model, teacher, val, 512, torch.Generator().manual_seed(args.seed)),
            "seconds": round(time.time() - started, 1),
        }
        history.append(row)
        print(json.dumps(row), flush=True)
    cfg = EvaluateConfig()
    model.eval()
    test_model = evaluate_split(model, test, cfg, "cpu")[0]
    test_optimum = evaluate_split(teacher, test, cfg, "cpu")[0]
    result = {
        "project": str(args.project),
        "variant": args.model,  # the key the records so far have
        "n_train_outfits": len(train.items),
        "settings": {k: v for k, v in vars(args).items() if k not in ("project", "out")},
        "optimum": "with_context" if with_context else "without_context",
        "history": history,
        "test": {
            "model": test_model,
            "optimum": test_optimum,
            "gap_to_optimum": test_model["cross_entropy"] - test_optimum["cross_entropy"],
        },
    }
    record(args.out, args.run, json.loads(json.dumps(result, default=str)))
    print("test", round(test_model["cross_entropy"], 4), "optimum", round(test_optimum["cross_entropy"], 4))


if __name__ == "__main__":
    main()
