"""Same tensors: a sha256 of every weight and of the optimizer's state after a short training of each of a few
models on a tiny planted fixture, so that a refactoring can be shown to leave the arithmetic and every random
stream as they were (run it before and after; the printed hashes must match line for line).

    python benchmarks/same_tensors.py [--epochs 3]

The models: the paper's [None] and [GSU], the bag of items with context, "none_attrs" (article attributes and
the attribute overlap), [GSU] with a customer history (the history bag and repeat), [GS] in the bag warm-up
(from epoch 1, taken back or kept at its end) and [GS] with the sampled softmax. Each trains a few dozen steps on
the CPU with one thread. The hashes are listed by position in the state_dict (its names printed beside, for
reading: a renamed submodule changes a name, never a hash), then one digest of them all.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from pathlib import Path

import torch

from contextual_bert.config import ModelConfig, TrainConfig
from contextual_bert.data import HISTORY_FEATURE, N_SPECIAL, PAD_INDEX, ContextSpec, EncodedOutfits, FeatureSpec
from contextual_bert.model import build_model
from contextual_bert.training import fit

N_STYLES, N_IDS, N_CATALOGUE, MAX_HISTORY = 8, N_SPECIAL + 38, N_SPECIAL + 38 + 6, 6
CONTEXT = ContextSpec(
    (
        FeatureSpec("style", "categorical", "customer", N_SPECIAL + N_STYLES, 8),
        FeatureSpec("brands", "multi_categorical", "customer", N_SPECIAL + 6, 4, max_values=3),
    )
)
HISTORY = ContextSpec(
    CONTEXT.features + (FeatureSpec(HISTORY_FEATURE, "history", "history", N_IDS, 8, max_values=MAX_HISTORY),)
)
ATTRIBUTES = ContextSpec((FeatureSpec("product_type", "categorical", "article", N_SPECIAL + 5, 8),))
MODEL = ModelConfig(d_model=16, n_blocks=2, n_heads=4, d_ff=32, dropout=0.1, max_set_size=8)
# (name, model, spec, train settings beyond TRAIN)
RUNS = [
    ("none", "none", CONTEXT, {}),
    ("global_state_update", "global_state_update", CONTEXT, {}),
    ("bag_of_items_context", "bag_of_items_context", CONTEXT, {}),
    ("none_attrs", "none_attrs", CONTEXT, {"id_dropout": 0.1}),
    ("global_state_update+history", "global_state_update", HISTORY, {"history_dropout": 0.2}),
    ("global_state+bag_warmup", "global_state", CONTEXT, {"bag_warmup_epochs": 2, "bag_warmup_check_steps": None}),
    ("global_state+sampled", "global_state", CONTEXT, {"softmax": "sampled", "negatives": 16}),
]


def train_settings(epochs: int, extra: dict) -> TrainConfig:
    """The same settings whatever the learning rate's warm-up is called (train.warmup_steps, later
    train.lr_warmup_steps) and whatever TrainConfig's defaults are: each one set that a default changed for."""
    warmup = "lr_warmup_steps" if "lr_warmup_steps" in TrainConfig.model_fields else "warmup_steps"
    settings = {
        "batch_size": 32,
        "max_epochs": epochs,
        "learning_rate": 3e-3,
        "weight_decay": 0.01,
        warmup: 5,
        "patience": epochs,
        "softmax": "full",
        "bag_warmup_epochs": 0,
        "bag_warmup_check_steps": None,
        "device": "cpu",
        "num_threads": 1,
        "checkpoint_every_s": 0,
    }
    return TrainConfig(**{**settings, **extra})


def planted(n: int, seed: int, history: bool) -> EncodedOutfits:
    """Outfits whose fourth article only the context's style tells; with `history`, each customer's earlier
    articles (some padding) too."""
    g = torch.Generator().manual_seed(seed)
    style = torch.randint(0, N_STYLES, (n,), generator=g)
    items = torch.zeros(n, 6, dtype=torch.long)
    items[:, :3] = N_SPECIAL + 32 + torch.rand(n, 6, generator=g).argsort(dim=1)[:, :3]
    items[:, 3] = N_SPECIAL + style * 4 + torch.randint(0, 4, (n,), generator=g)
    items[n // 2 :, 4] = N_SPECIAL + torch.randint(0, 32, (n - n // 2,), generator=g)
    brands = torch.randint(N_SPECIAL, N_SPECIAL + 6, (n, 3), generator=g)
    brands[torch.rand(n, 3, generator=g) < 0.3] = PAD_INDEX
    context = {"style": style + N_SPECIAL, "brands": brands}
    if history:
        earlier = N_SPECIAL + style[:, None] * 4 + torch.randint(0, 4, (n, MAX_HISTORY), generator=g)
        context[HISTORY_FEATURE] = earlier.masked_fill(torch.rand(n, MAX_HISTORY, generator=g) < 0.3, PAD_INDEX)
    return EncodedOutfits(items, context)


def sha(tensor: torch.Tensor) -> str:
    tensor = tensor.detach().cpu().contiguous()
    data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(f"{tensor.dtype} {tuple(tensor.shape)} ".encode() + data).hexdigest()


def optimizer_tensors(state: dict) -> list[tuple[str, torch.Tensor]]:
    """The optimizer's state tensors in parameter order (exp_avg, exp_avg_sq, step), and its groups' settings."""
    out = []
    for index in sorted(state["state"]):
        for name in sorted(state["state"][index]):
            out.append((f"optimizer.{index}.{name}", torch.as_tensor(state["state"][index][name])))
    for i, group in enumerate(state["param_groups"]):
        out.append((f"optimizer.group{i}", torch.tensor([float(group[k]) for k in ("lr", "weight_decay")])))
    return out


def run(name: str, variant: str, spec: ContextSpec, extra: dict, epochs: int, work: Path) -> list[str]:
    history = HISTORY_FEATURE in {f.name for f in spec.features}
    attributes = ATTRIBUTES if variant.endswith("_attrs") else None
    torch.manual_seed(0)
    model = build_model(MODEL, variant, N_IDS, spec, attributes)
    if attributes is not None:
        g = torch.Generator().manual_seed(5)
        types = torch.randint(N_SPECIAL, N_SPECIAL + 5, (N_CATALOGUE,), generator=g)
        types[:N_SPECIAL] = PAD_INDEX
        model.set_catalogue({"product_type": types})
    train, val = planted(300, 0, history), planted(60, 1, history)
    metrics = fit(model, train, val, train_settings(epochs, extra), work / name, seed=3)
    last = torch.load(work / name / "last.pt", map_location="cpu", weights_only=True)
    lines = [
        f"{name}: epochs {metrics['epochs']}, best epoch {metrics['best_epoch']}, "
        f"best val {metrics['best_val_cross_entropy']!r}"
    ]
    tensors = list(model.state_dict().items()) + optimizer_tensors(last["optimizer"])
    for i, (key, tensor) in enumerate(tensors):
        lines.append(f"  {i:3d} {sha(tensor)[:16]}  {key}")
    digest = hashlib.sha256("".join(sha(t) for _, t in tensors).encode()).hexdigest()
    lines.append(f"  all {digest}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per model (10 steps each)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        for name, variant, spec, extra in RUNS:
            print("\n".join(run(name, variant, spec, extra, args.epochs, Path(work))), flush=True)


if __name__ == "__main__":
    main()
