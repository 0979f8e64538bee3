"""The report stage's plots: recall@K curves (and their CSV for `dvc plots`) and the training curves."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import cast

import numpy as np


def _recall_curves(evals: dict[str, list[dict]], popularity: dict) -> dict[str, tuple[list, list]]:
    """model -> (k, mean recall over seeds) for the k every seed has."""
    curves = {}
    for name, runs in {**evals, "popularity": [popularity]}.items():
        per_seed = [
            dict(zip(r["recall_curve"]["k"], r["recall_curve"]["test"]))
            for r in runs
            if isinstance(r.get("recall_curve"), dict)
        ]
        if not per_seed:
            continue
        ks = sorted(set.intersection(*(set(c) for c in per_seed)))
        curves[name] = (ks, [float(np.mean([c[k] for c in per_seed])) for k in ks])
    return curves


def _num(value) -> float:
    return float("nan") if value is None else float(value)


def write_plots(
    plots_dir: Path,
    evals: dict[str, list[dict]],
    popularity: dict,
    training_curves: dict[str, dict[int, list[dict]]],
    labels: dict[str, str],
) -> list[Path]:
    """recall_at_k.png / .csv and training_curves.png under plots_dir; `labels`: a model's name in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    plots_dir.mkdir(parents=True, exist_ok=True)
    tab10 = plt.get_cmap("tab10")
    assert isinstance(tab10, ListedColormap)  # a listed map: its ten colours, RGB tuples
    colors = dict(zip(list(labels)[1:], cast(list, tab10.colors)))
    written = []

    curves = _recall_curves(evals, popularity)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for name, (ks, recall) in curves.items():
        style = {"color": "grey", "linestyle": "--"} if name == "popularity" else {"color": colors.get(name)}
        ax.plot(ks, [r * 100 for r in recall], label=labels.get(name, name), linewidth=1.8, **style)
    ax.set_xscale("log")
    k_max = max((ks[-1] for ks, _ in curves.values() if ks), default=1)
    ticks = [k for k in (1, 2, 5, 10, 20, 50, 100, 250, 500, 1000, 2500, 5000) if k <= k_max]
    ax.set_xticks(ticks, [str(k) for k in ticks])
    ax.set_xlabel("k (log scale)")
    ax.set_ylabel("recall@k on the test split (%)")
    ax.set_title("Recall@k, mean over seeds")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(plots_dir / "recall_at_k.png")
    plt.close(fig)
    written.append(plots_dir / "recall_at_k.png")

    rows = [{"model": name, "k": k, "recall": r} for name, (ks, rec) in curves.items() for k, r in zip(ks, rec)]
    (plots_dir / "recall_at_k.json").write_text(json.dumps(rows, indent=1))
    all_k = sorted({k for ks, _ in curves.values() for k in ks})
    with open(plots_dir / "recall_at_k.csv", "w", newline="") as f:  # wide: one column per model, for DVC
        writer = csv.writer(f)
        writer.writerow(["k", *curves])
        for k in all_k:
            writer.writerow([k, *(dict(zip(*curves[n])).get(k, "") for n in curves)])
    written += [plots_dir / "recall_at_k.json", plots_dir / "recall_at_k.csv"]

    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120)
    rows = []
    for model, per_seed in training_curves.items():
        for i, (seed, curve) in enumerate(sorted(per_seed.items())):
            epochs = [h["epoch"] for h in curve]
            label = labels.get(model, model) if i == 0 else None
            # The training sample's cross-entropy, measured as validation's (older runs: the objective's loss).
            train_key = "train_cross_entropy" if all("train_cross_entropy" in h for h in curve) else "train_loss"
            ax_train.plot(
                epochs,
                [_num(h.get(train_key)) for h in curve],
                color=colors.get(model),
                label=label,
                alpha=0.85,
                marker=".",
            )
            ax_val.plot(
                epochs,
                [_num(h.get("val_cross_entropy")) for h in curve],
                color=colors.get(model),
                label=label,
                alpha=0.85,
                marker=".",
            )
            rows += [
                {
                    "model": model,
                    "seed": seed,
                    "epoch": h["epoch"],
                    "train_loss": h.get("train_loss"),
                    "train_cross_entropy": h.get("train_cross_entropy"),
                    "val_cross_entropy": h.get("val_cross_entropy"),
                }
                for h in curve
            ]
    for ax, title in (
        (ax_train, "Training cross-entropy (a fixed sample, measured as validation)"),
        (ax_val, "Validation cross-entropy"),
    ):
        ax.set_xlabel("epoch")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("Training curves, one line per seed")
    fig.tight_layout()
    fig.savefig(plots_dir / "training_curves.png")
    plt.close(fig)
    (plots_dir / "training_curves.json").write_text(json.dumps(rows, indent=1))
    written += [plots_dir / "training_curves.png", plots_dir / "training_curves.json"]
    return written
