"""Can a softmax head of width d express the planted optimum? The head's own floor, before any encoder.

Every model of the project ends in one dot-product softmax: log Q(a | case) = h(case) . e_a + b_a (plus, in
the attribute models, offsets for attribute values the outfit already holds), with h of width d_model = 128.
The planted optimum is a mixture over K = 128 tastes, and the log of a mixture need not be a rank-d function
of (case, article): the softmax bottleneck (Yang et al. 2018). This benchmark measures what that costs on the
planted data. It takes the optimum's exact distributions P(. | case) on a sample of validation cases (every
position of an outfit masked in turn, as evaluation does) and fits to them the best head of width d: a free
vector h per case (as if the encoder were perfect), shared output vectors e_a and biases b_a, minimising
mean KL(P || Q), the expected excess cross-entropy over the optimum on those cases. It does so

- `plain`: as a model of ids only sees it;
- `types masked`: with the articles of product types already in the outfit removed from Q, as the attribute
  models' outfit offsets (model.AttributeOverlap) can learn to do.

The true minimum is a floor for any model with such a head on these cases; the fit reaches it from above,
so a small fitted KL says the head is not what holds a model back, and a large one is an upper bound on the
head's cost (with the fit's curve to show whether it had stopped falling).

    python studies/planted_capacity/softmax_bottleneck.py --project <planted project> --outfits 1500 --widths 32 128 512 \
        --run softmax_bottleneck
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from contextual_bert.config import ModelConfig
from contextual_bert.data import MASK_INDEX, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX, load_split
from contextual_bert.evaluation import optimum_from_features

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import record  # noqa: E402


def optimum_cases(optimum, items: torch.Tensor, context: dict, batch: int = 2048) -> torch.Tensor:
    """log P over the real articles (cases, V) for every known position of every outfit, masked in turn."""
    outfit, position = (items != PAD_INDEX).nonzero(as_tuple=True)
    known = items[outfit, position] != UNKNOWN_INDEX
    outfit, position = outfit[known], position[known]
    log_p = []
    for start in range(0, len(outfit), batch):
        o, p = outfit[start : start + batch], position[start : start + batch]
        masked = items[o].clone()
        masked[torch.arange(len(o)), p] = MASK_INDEX
        log_p.append(optimum.masked_logits(masked, {k: v[o] for k, v in context.items()})[:, N_SPECIAL:].float())
    return torch.cat(log_p)


def fit_head(
    log_p: torch.Tensor, mask: torch.Tensor | None, width: int, steps: int, lr: float, seed: int, check: int = 50
) -> dict:
    """The best width-`width` softmax head for the cases' distributions: mean KL(P || Q) and its curve."""
    gen = torch.Generator().manual_seed(seed)
    n, v = log_p.shape
    p = log_p.exp()
    entropy = -(p * log_p.masked_fill(p == 0, 0.0)).sum(1).mean()
    h = torch.nn.Parameter(torch.randn(n, width, generator=gen) * 0.1)
    e = torch.nn.Parameter(torch.randn(v, width, generator=gen) * 0.1)
    b = torch.nn.Parameter(torch.log(p.mean(0) + 1e-12).clone())
    optimizer = torch.optim.Adam([h, e, b], lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    curve = []
    for step in range(1, steps + 1):
        logits = h @ e.T + b
        if mask is not None:
            logits = logits.masked_fill(mask, float("-inf"))
        log_q = torch.log_softmax(logits, dim=1)
        kl = -(p * log_q.masked_fill(p == 0, 0.0)).sum(1).mean() - entropy
        optimizer.zero_grad()
        kl.backward()
        optimizer.step()
        schedule.step()
        if step % check == 0 or step == steps:
            curve.append({"step": step, "kl": kl.item()})
            print(f"  width {width} step {step} KL {kl.item():.4f}", flush=True)
    return {"kl": curve[-1]["kl"], "curve": curve}


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
    parser.add_argument("--split", default="val")
    parser.add_argument("--outfits", type=int, default=1500, help="validation outfits sampled (each gives 4-8 cases)")
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    raw, features = args.project / "data/raw", args.project / "data/features"
    data = load_split(features, args.split, ModelConfig().max_set_size)
    rows = torch.from_numpy(
        np.sort(
            np.random.default_rng(args.seed).choice(
                len(data.items), size=min(args.outfits, len(data.items)), replace=False
            )
        )
    )
    items, context = data.items[rows], {k: v[rows] for k, v in data.context.items()}
    result = {
        "project": str(args.project),
        "split": args.split,
        "n_outfits": len(rows),
        "steps": args.steps,
        "lr": args.lr,
        "optima": {},
    }
    for name, with_context in (("without_context", False), ("with_context", True)):
        started = time.time()
        log_p = optimum_cases(optimum_from_features(raw, features, with_context), items, context)
        taken = torch.isneginf(log_p)  # the optimum gives 0 exactly to the articles of types the outfit holds
        fits = {}
        for label, mask in (("plain", None), ("types_masked", taken)):
            for width in args.widths:
                print(name, label, width, flush=True)
                fits[f"{label} d={width}"] = fit_head(log_p, mask, width, args.steps, args.lr, args.seed)
        result["optima"][name] = {"n_cases": len(log_p), "fits": fits, "seconds": round(time.time() - started, 1)}
    record(args.out, args.run, result)


if __name__ == "__main__":
    main()
