"""Why a row stands where it does: for trained runs of the study's project, without training anything.

Per run, with every outfit's first article masked (one case per outfit, the whole vocabulary ranked):
- the cross-entropy on the training, validation and test outfits (the gap: fitting the training outfits);
- the temperature T that minimises the validation cross-entropy, and the test cross-entropy at T (how much of the
  loss is calibration, not ranking);
- where the context enters: the conditioning study's per-block probe (conditioning.context_influence: each block's
  output change when the outfit reads another test outfit's customer, and the target's log-prob change);
- for [AdaLN], per block and sublayer, the mean gate a over the test outfits and its spread across them (how far
  the block is on, and how much the customer decides it).
Recorded in results.json as `diagnose/<run>`.

    python studies/adaptive_norm/diagnose.py --workdir /tmp/adaln --runs adaptive_norm-s0 concat-s0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.conditioning.conditioning import context_influence  # noqa: E402
from studies.project import record  # noqa: E402

HERE = Path(__file__).resolve().parent
TEMPERATURES = [0.5 + 0.05 * i for i in range(31)]  # 0.5 .. 2.0


def first_masked(data):
    """(masked items, targets, contexts) with every outfit's first article masked; the outfits whose first article
    is outside the vocabulary ([UNK]: no score) left out."""
    from contextual_bert.data import MASK_INDEX, N_SPECIAL

    known = data.items[:, 0] >= N_SPECIAL
    masked = data.items[known].clone()
    masked[:, 0] = MASK_INDEX
    return masked, data.items[known, 0], {k: v[known] for k, v in data.context.items()}


def logits_of(model, data, batch: int = 512):
    import torch

    masked, target, context = first_masked(data)
    with torch.no_grad():
        parts = [
            model.masked_logits(masked[i : i + batch], {k: v[i : i + batch] for k, v in context.items()})
            for i in range(0, len(masked), batch)
        ]
    return torch.cat(parts).float(), target


def cross_entropy(logits, target, temperature: float = 1.0) -> float:
    import torch.nn.functional as F

    return float(F.cross_entropy(logits / temperature, target))


def gates(model, data) -> list[dict] | None:
    """[AdaLN]'s gates per block: mean over test outfits and units, and the spread of an outfit's mean gate."""
    import torch

    if model.adaptive_condition is None:
        return None
    with torch.no_grad():
        condition = model.adaptive_condition(model.context(data.context))
        rows = []
        for block in model.blocks:
            _, _, gate_1, _, _, gate_2 = block.modulation(condition)
            rows.append({name: {"mean": float(g.mean()), "mean_abs": float(g.abs().mean()),
                                "outfit_spread": float(g.mean(dim=1).std())}
                         for name, g in (("attention", gate_1), ("feed_forward", gate_2))})  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True, help="the study's project (adaptive_norm.py)")
    parser.add_argument("--runs", nargs="+", required=True, help="<model>-s<seed> run names of that project")
    parser.add_argument("--out", type=Path, default=HERE / "results.json", help="the results file")
    args = parser.parse_args()

    import torch

    from contextual_bert.config import load_config
    from contextual_bert.data import load_split
    from contextual_bert.model import load_checkpoint

    torch.set_num_threads(1)
    cfg = load_config(args.workdir / "params.yaml")
    splits = {s: load_split(cfg.paths.features_dir, s, cfg.model.max_set_size) for s in ("train", "val", "test")}
    for run in args.runs:
        model, _ = load_checkpoint(cfg.paths.models_dir / run / "checkpoint.pt")
        model.eval()
        logits = {split: logits_of(model, data) for split, data in splits.items()}
        ce = {split: cross_entropy(*pair) for split, pair in logits.items()}
        best = min(TEMPERATURES, key=lambda t: cross_entropy(*logits["val"], t))
        entry = {"cross_entropy_first_masked": ce, "val_temperature": round(best, 2),
                 "test_at_val_temperature": cross_entropy(*logits["test"], best), "gates": gates(model, splits["test"]),
                 "context": context_influence(cfg.paths.models_dir / run, cfg.paths.features_dir,
                                              cfg.model.max_set_size)}  # fmt: skip
        record(args.out, f"diagnose/{run}", entry)
        print(run, entry)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
