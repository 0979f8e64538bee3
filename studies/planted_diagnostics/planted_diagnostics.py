"""Why [None] stays at popularity on planted data: one change at a time to the model or the recipe.

A diagnostic, not part of the pipeline: it trains [None] (or another model) with the library's own loop
(`training.fit`) on a features folder that the pipeline already wrote for planted data (e.g. a learning-curve
size: studies/learning_curve/learning_curve.py keeps each size's project under its --workdir), after changing one thing,
some of them by replacing a method of the model (the head, the output layer) for this process only.

    python studies/planted_diagnostics/planted_diagnostics.py base --features /tmp/contextual-bert-learning-curve/n50000/data/features
    python studies/planted_diagnostics/planted_diagnostics.py nohead --head none --features ...

Writes <out>/<name>/curve.json (validation and training-sample cross-entropy per epoch) and prints it;
with --test also <out>/<name>/test.json, as the evaluate stage writes it (pairable with the pipeline's runs).
Measured: studies/planted_diagnostics/ (findings.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import get_args

import torch
import torch.nn.functional as F
from torch import nn

from contextual_bert.config import EvaluateConfig, InitEmbeddings, ModelConfig, TrainConfig
from contextual_bert.data import MASK_INDEX, N_SPECIAL, PAD_INDEX, load_article_vocab, load_spec, load_split
from contextual_bert.evaluation import evaluate_model  # the evaluate stage's result, per-outfit record included
from contextual_bert.model import build_model
from contextual_bert.training import fit, init_from_cooccurrence

HEADS = {  # the head before the tied output layer; "gelu" is the model's own
    "gelu": None,
    "none": lambda model, h: h,
    "linear": lambda model, h: model.head_transform(h),
    "layernorm": lambda model, h: F.layer_norm(F.gelu(model.head_transform(h)), h.shape[-1:]),
}


def hide_mask_keys(model) -> None:
    """[MASK] positions get no attention as keys (unless a row has nothing else), for this model only."""
    from contextual_bert.model import MultiHeadSelfAttention

    seen = {}
    model_forward = model.forward

    def forward(items, context=None, select=None):
        seen["items"] = items
        return model_forward(items, context, select)

    attention_forward = MultiHeadSelfAttention.forward

    def attention(self, h, key_bias, select=None):
        items = seen["items"]
        hidden = items == MASK_INDEX
        hidden &= ((items != MASK_INDEX) & (items != PAD_INDEX)).any(dim=1, keepdim=True)
        if h.shape[0] == items.shape[1] + 1:  # [NP]: the context position comes first (h is (L, B, d))
            hidden = F.pad(hidden, (1, 0), value=False)
        key_bias = key_bias.masked_fill(hidden[:, None, None, :], float("-inf"))
        return attention_forward(self, h, key_bias, select)

    model.forward = forward
    MultiHeadSelfAttention.forward = attention


def pre_norm(model) -> None:
    """Pre-norm blocks for this model ([None] only: no global-state sublayer)."""
    from contextual_bert.model import Block

    def forward(self, h, key_bias, global_state=None, select=None):
        residual = h if select is None else h.transpose(0, 1)[select]  # h: (L, B, d)
        h = residual + self.dropout(self.attention(self.attention_norm(h), key_bias, select))
        return h + self.dropout(self.feed_forward(self.feed_forward_norm(h)))

    Block.forward = forward
    head = type(model).head
    type(model).head = lambda self, h: head(self, F.layer_norm(h, h.shape[-1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("--features", type=Path, required=True, help="the features stage's folder (planted data)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/planted-diagnostics"))
    parser.add_argument("--model", default="none", help="a model of ids (train.models; the script loads no catalogue)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=8, help="max_epochs: the cosine horizon")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--head", choices=sorted(HEADS), default="gelu")
    parser.add_argument("--head-identity", action="store_true", help="the head's W starts at the identity")
    parser.add_argument("--untied", action="store_true", help="an output embedding table of its own")
    parser.add_argument("--mask-zero", action="store_true", help="the [MASK] row starts at zero")
    parser.add_argument(
        "--bias-init",
        action="store_true",
        help="the output bias starts at the log unigram frequencies of the training split",
    )
    parser.add_argument("--mask-token-prob", type=float, default=0.8)
    parser.add_argument("--random-token-prob", type=float, default=0.1)
    parser.add_argument(
        "--no-mask-key",
        action="store_true",
        help="[MASK] positions are hidden as keys: a [MASK] reads the outfit's other articles only",
    )
    parser.add_argument(
        "--init",
        choices=["default", "bert", "zero-out"],
        default="default",
        help="bert: every Linear N(0, 0.02), biases 0 (as Hugging Face BERT); zero-out: each "
        "block's attention and FFN output projections start at 0 (blocks start as LayerNorm)",
    )
    parser.add_argument(
        "--pre-norm",
        action="store_true",
        help="pre-norm blocks (h + Attn(LN(h)), h + FFN(LN(h))) and a LayerNorm without gain "
        "before the head: the same parameters",
    )
    parser.add_argument(
        "--init-embeddings",
        choices=get_args(InitEmbeddings),
        default="random",
        help="train.init_embeddings: cooccurrence starts the article embeddings (tied: also the "
        "output side) at the training outfits' factorised PPMI (contextual_bert.training.cooccurrence)",
    )
    parser.add_argument(
        "--test",
        action="store_true",
        help="also score the best checkpoint on the test (and validation) split: writes the "
        "evaluate stage's JSON, per-outfit record included, as <out>/<name>/test.json",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)

    spec, n_items = load_spec(args.features), len(load_article_vocab(args.features))
    train, val = load_split(args.features, "train", 8), load_split(args.features, "val", 8)
    model_cfg = ModelConfig(
        d_model=128, n_blocks=args.blocks, n_heads=8, d_ff=256, dropout=args.dropout, max_set_size=8
    )
    train_cfg = TrainConfig(
        batch_size=args.batch,
        max_epochs=args.epochs,
        learning_rate=args.lr,
        weight_decay=0.01,
        lr_warmup_steps=200,
        patience=args.epochs,
        num_threads=1,
        device="cpu",
        mask_token_prob=args.mask_token_prob,
        random_token_prob=args.random_token_prob,
    )
    torch.manual_seed(args.seed)
    model = build_model(model_cfg, args.model, n_items, spec)
    cls = type(model)
    if HEADS[args.head] is not None:
        cls.head = HEADS[args.head]
    if args.head_identity:
        with torch.no_grad():
            model.head_transform.weight.copy_(torch.eye(model_cfg.d_model))
            model.head_transform.bias.zero_()
    if args.untied:  # named as the bag of items' table, so that --init-embeddings cooccurrence starts it too
        model.output_embeddings = nn.Embedding(n_items, model_cfg.d_model)
        nn.init.normal_(model.output_embeddings.weight, std=model_cfg.d_model**-0.5)
        cls.output_layer = lambda self: (self.output_embeddings.weight, self.output_bias)
    if args.init == "bert":
        for module in model.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
    if args.init == "zero-out":
        for block in model.blocks:
            for layer in (block.attention.output, block.feed_forward.output):
                nn.init.zeros_(layer.weight)
                nn.init.zeros_(layer.bias)
    if args.no_mask_key:
        hide_mask_keys(model)
    if args.pre_norm:
        pre_norm(model)
    with torch.no_grad():
        if args.mask_zero:
            model.item_embeddings.weight[MASK_INDEX].zero_()
        if args.bias_init:
            counts = torch.bincount(train.items.reshape(-1), minlength=n_items).double()[N_SPECIAL:] + 1
            log_p = (counts / counts.sum()).log()
            model.output_bias[N_SPECIAL:] = (log_p - log_p.mean()).float()

    if args.init_embeddings == "cooccurrence":
        init_from_cooccurrence(model, train.items)
    fit(model, train, val, train_cfg, args.out / args.name, args.seed)
    history = json.loads((args.out / args.name / "curve.json").read_text())
    for row in history:
        print(args.name, row["epoch"], f"val {row['val_cross_entropy']:.4f} train {row['train_cross_entropy']:.4f}")
    if args.test:  # the best epoch's weights, into this process's (patched) model
        best = torch.load(args.out / args.name / "checkpoint.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(best["state_dict"])
        result = evaluate_model(
            model.eval(),
            args.name,
            args.model,
            args.seed,
            None,
            args.features,
            model_cfg.max_set_size,
            args.out / args.name / "test.json",
            EvaluateConfig(),
        )
        metrics = result["test"]
        print(args.name, "test", f"{metrics['cross_entropy']:.4f}", "recall@5", f"{metrics['recall@5']:.4f}")


if __name__ == "__main__":
    main()
