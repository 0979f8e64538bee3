"""The per-model sweep: its settings, its choice and its report (no orchestration here).

Each model gets its own settings (learning rate first), chosen on the validation split and never on test:
every combination of `sweep.grid` (or the model's own `sweep.grids.<model>`) trains
`train@<model>-<sweep.seed>` as one DVC experiment
(`dvc exp run --queue -S ++per_model.<model>.<key>=<value> ...`, flows/sweep.py runs the queue), and the
setting with the lowest best-epoch validation cross-entropy wins. The winners go to `per_model:` in
params.yaml, so `dvc repro` then re-trains exactly the models whose settings changed.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

from contextual_bert.config import Config
from contextual_bert.errors import ContextualBertError

OBJECTIVE = "best_val_cross_entropy"  # from reports/train/<run>.json; lower is better
INTEGER_KEYS = ("batch_size",)
NAMED_KEYS = ("init_embeddings",)  # values are names (config.InitEmbeddings), not numbers


def sweep_models(cfg: Config) -> list[str]:
    models = list(cfg.sweep.models or cfg.train.models)
    unknown = [v for v in models if v not in cfg.train.models]
    if unknown:
        raise ContextualBertError(f"params.yaml: sweep.models {unknown} are not in train.models")
    unswept = sorted(set(cfg.sweep.grids) - set(models))
    if unswept:
        raise ContextualBertError(f"params.yaml: sweep.grids names {unswept}, which the sweep does not train")
    if cfg.sweep.seed not in cfg.train.seeds:
        raise ContextualBertError(
            f"params.yaml: sweep.seed {cfg.sweep.seed} is not one of train.seeds "
            f"{cfg.train.seeds} (the sweep trains train@<model>-<seed>)"
        )
    return models


def settings_grid(cfg: Config, model: str | None = None) -> list[dict]:
    """Every combination of the model's grid (`sweep.grids.<model>`, else `sweep.grid`), as {key: value},
    in the grid's order."""
    grid = cfg.sweep.grids.get(model) or cfg.sweep.grid
    keys = list(grid)
    if not keys or any(not grid[k] for k in keys):
        where = f"sweep.grids.{model}" if model in cfg.sweep.grids else "sweep.grid"
        raise ContextualBertError(f"params.yaml: {where} needs at least one value for each key")
    for k in keys:
        if (k in NAMED_KEYS) != all(isinstance(v, str) for v in grid[k]):
            where = f"sweep.grids.{model}" if model in cfg.sweep.grids else "sweep.grid"
            raise ContextualBertError(
                f"params.yaml: {where}.{k} takes " + ("names" if k in NAMED_KEYS else "numbers") + f", got {grid[k]}"
            )
    combos = itertools.product(*(grid[k] for k in keys))
    return [
        {k: v if k in NAMED_KEYS else int(v) if k in INTEGER_KEYS else float(v) for k, v in zip(keys, values)}
        for values in combos
    ]


def experiments(cfg: Config) -> list[dict]:
    """One experiment per (model, setting): its name, DVC target and `-S` parameter overrides."""
    planned = []
    for model in sweep_models(cfg):
        for i, setting in enumerate(settings_grid(cfg, model)):
            planned.append(
                {
                    "name": f"sweep-{model.replace('_', '-')}-{i}",
                    "model": model,
                    "setting": setting,
                    "target": f"train@{model}-{cfg.sweep.seed}",  # the matrix stage
                    "set_params": [f"++per_model.{model}.{k}={v}" for k, v in setting.items()],
                }
            )
    return planned


def rows_from_exp_show(exp_show: list[dict], cfg: Config) -> list[dict]:
    """(model, setting, objective, convergence) of every finished sweep experiment in `dvc exp show --json`.

    An experiment is recognised by its name (`sweep-<model>-<i>`), the newest of that name; its setting is
    read back from its params, its result from reports/train/<model>-s<seed>.json. Failed or unfinished
    ones are skipped.
    """
    names = {e["name"]: e for e in experiments(cfg)}
    newest: dict[str, dict] = {}  # an earlier sweep's experiments (`-A`: other commits) carry the same names
    for commit in exp_show:
        for exp in [commit] + [e for branch in commit.get("experiments") or [] for e in branch.get("revs", [])]:
            name = exp.get("name")
            if name not in names or not exp.get("data"):
                continue
            if name not in newest or (exp["data"].get("timestamp") or "") > (
                newest[name]["data"].get("timestamp") or ""
            ):
                newest[name] = exp
    rows = []
    for name in (n for n in names if n in newest):  # grid order
        planned, data, exp = names[name], newest[name]["data"], newest[name]
        metrics_file = str(cfg.train_metrics_path(planned["model"], cfg.sweep.seed))
        result = (data.get("metrics") or {}).get(metrics_file, {}).get("data") or {}
        params = (data.get("params") or {}).get("params.yaml", {}).get("data") or {}
        overrides = (params.get("per_model") or {}).get(planned["model"]) or {}
        setting = {k: overrides.get(k) for k in planned["setting"]}
        objective = result.get(OBJECTIVE)
        if objective is None or not math.isfinite(float(objective)):
            continue
        rows.append(
            {
                "experiment": name,
                "rev": exp.get("rev"),
                "model": planned["model"],
                "setting": setting,
                OBJECTIVE: float(objective),
                "converged": result.get("converged"),
                "best_epoch": result.get("best_epoch"),
                "epochs": result.get("epochs"),
            }
        )
    return rows


def choose(rows: list[dict]) -> dict[str, dict]:
    """model -> the setting with the lowest objective (ties: the first in grid order)."""
    best: dict[str, dict] = {}
    for row in rows:
        if row["model"] not in best or row[OBJECTIVE] < best[row["model"]][OBJECTIVE]:
            best[row["model"]] = row
    return {model: dict(row["setting"]) for model, row in best.items()}


def write_report(rows: list[dict], choice: dict[str, dict], out_dir: Path) -> list[Path]:
    """reports/sweep/: sweep.json (every row and the choice), sweep.md (a table) and sweep.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sweep.json").write_text(json.dumps({"objective": OBJECTIVE, "rows": rows, "choice": choice}, indent=2))
    keys = sorted({k for row in rows for k in row["setting"]})
    lines = [
        "# Sweep: validation cross-entropy per model and setting",
        "",
        "One seed per setting; the lowest best-epoch validation cross-entropy wins (marked **). Never chosen on test.",
        "",
        "| Model | " + " | ".join(keys) + " | Val cross-entropy | Best epoch / epochs | Converged |",
        "|---|" + "---|" * (len(keys) + 3),
    ]
    for row in sorted(
        rows,
        key=lambda r: (
            r["model"],
            [str(r["setting"].get(k) or 0) if k in NAMED_KEYS else r["setting"].get(k) or 0 for k in keys],
        ),
    ):
        chosen = choice.get(row["model"]) == row["setting"]
        value = f"{row[OBJECTIVE]:.4f}"
        lines.append(
            f"| {row['model']} | "
            + " | ".join(str(row["setting"].get(k)) for k in keys)
            + f" | {'**' + value + '**' if chosen else value} | {row['best_epoch']} / {row['epochs']} | "
            f"{row['converged'] or 'no'} |"
        )
    (out_dir / "sweep.md").write_text("\n".join(lines) + "\n")

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    x_key = "learning_rate" if "learning_rate" in keys else keys[0]
    for model in sorted({r["model"] for r in rows}):
        for name in sorted({str(r["setting"].get("init_embeddings", "")) for r in rows if r["model"] == model}):
            points = sorted(
                (r["setting"][x_key], r[OBJECTIVE])
                for r in rows
                if r["model"] == model and str(r["setting"].get("init_embeddings", "")) == name
            )
            ax.plot(
                [p[0] for p in points], [p[1] for p in points], marker="o", label=model + (f" ({name})" if name else "")
            )
    ax.set_xscale("log")
    ax.set_xlabel(x_key)
    ax.set_ylabel("best validation cross-entropy (nats)")
    ax.set_title("Sweep, one seed per setting")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "sweep.png")
    plt.close(fig)
    return [out_dir / "sweep.json", out_dir / "sweep.md", out_dir / "sweep.png"]
