"""The conditioning map (issue 70): on which data does a global state beat concatenation, and does a state the
outfit writes to ([GS2]) beat [GSU]?

The grid is declared in `settings.yaml` (committed before any result): planted data whose context acts as a prior
over the latent taste only, or also switches which styles go together; a few clean context columns, or the
paper's many mixed columns (mostly noise); two data sizes. Every cell trains every variant of `variants` with
every seed, each variant at the learning rate its sweep chose on validation (`sweep`: one middle cell, seed 0;
a choice at the grid's edge extends the grid by the declared next rate, once). Every cell's optimum with and
without context and its popularity are its yardsticks.

Each cell is a project of its own under --work (studies/project.py): its data stages run through the CLI
(ingest, validate, features, baseline, optimum), its trainings in --jobs worker processes that call the library
(`training.train`, `evaluation.evaluate_run`; no MLflow), and its report stage through the CLI again. Results go
to this folder's results.json: `<cell>/optimum`, `<cell>/runs/<model>-s<seed>`, `<cell>/summary`,
`<cell>/table1`, `sweep/<model>/<rate>`, `sweep/choice`; `settings` holds the commit and the settings file.

    python studies/conditioning/conditioning.py --work /tmp/conditioning [--jobs 2] [--only sweep|map] [--cells a,b]

Per run it also measures where the context enters (`context_influence`): with every test outfit's first item
masked, the relative change of each block's output when the outfit reads another customer's context (a donor of
the same length), and the mean absolute change of the target's log-probability.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import Project, override, record, relocated  # noqa: E402

HERE = Path(__file__).resolve().parent
SETTINGS = HERE / "settings.yaml"
OUT = HERE / "results.json"  # the results file (--out: a trial's own)
DATA_STAGES = ("ingest", "validate", "features", "baseline", "optimum")
YARDSTICKS = ("optimum_context", "optimum_no_context", "popularity")


# --- the grid -------------------------------------------------------------------------------------------------


def cells(settings: dict) -> dict[str, list[str]]:
    """cell name ("<context>-<columns>-<size>") -> its --set overrides (the base's first, then each axis')."""
    axes = settings["axes"]
    out = {}
    for values in itertools.product(*(axes[axis].items() for axis in axes)):
        name = "-".join(value for value, _ in values)
        out[name] = list(settings["base"]) + [s for _, sets in values for s in sets]
    return out


def cell_params(overrides: list[str], root: Path, settings: dict) -> dict:
    """params.yaml with the overrides, under `root`; the study's models and seeds (the report reads them), and
    every model on the cell's horizon (params.yaml gives [C] and [NP] a longer one)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for assignment in overrides:
        override(params, assignment)
    params["train"] |= {"num_threads": 1, "models": list(settings["variants"]), "seeds": list(settings["seeds"])}
    for model in settings["variants"]:
        params["per_model"][model]["max_epochs"] = params["train"]["max_epochs"]
    return relocated(params, root)


# --- one training, in a worker process ------------------------------------------------------------------------


def _pin() -> None:
    from contextual_bert import cpu_kernels
    from contextual_bert.config import TrainConfig

    cpu_kernels.pin(TrainConfig().cpu_kernels)  # before torch is imported: the libraries read it once


def context_influence(run_dir: Path, features_dir: Path, max_set_size: int, n_outfits: int = 500) -> dict:
    """Where the context enters: per block, ||h(c') - h(c)|| / ||h(c)|| over the real positions when each test
    outfit (its first item masked) reads a donor's context c'; and the mean |change| of the target's log-prob."""
    import torch

    from contextual_bert.data import MASK_INDEX, N_SPECIAL, PAD_INDEX, load_split
    from contextual_bert.evaluation import donor_outfits
    from contextual_bert.model import load_checkpoint

    model, _ = load_checkpoint(run_dir / "checkpoint.pt")
    if not hasattr(model, "blocks"):
        return {}
    data = load_split(features_dir, "test", max_set_size)
    data = data.subset(torch.arange(min(n_outfits, len(data))))
    items = data.items
    target = items[:, :1].clone()
    masked = items.clone()
    masked[:, 0] = MASK_INDEX
    donor = donor_outfits(items)
    donor_context = {name: values[donor] for name, values in data.context.items()}
    real = (items != PAD_INDEX).float()

    def hidden_and_log_prob(context):
        outputs: list[torch.Tensor] = []
        hooks = [b.register_forward_hook(lambda _m, _i, out: outputs.append(out)) for b in model.blocks]
        try:
            with torch.no_grad():
                logits = model.masked_logits(masked, context).float()[:, N_SPECIAL:]
        finally:
            for hook in hooks:
                hook.remove()
        log_prob = logits.gather(1, target - N_SPECIAL) - torch.logsumexp(logits, dim=1, keepdim=True)
        return outputs, log_prob.squeeze(1)

    def per_outfit(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(vectors, weights) of a block's output: every real position of (L, B, d), [NP]'s extra position
        dropped; or the masked position of each outfit, (B, d), where the last block computed only those."""
        if h.dim() == 2:
            return h, torch.ones(len(h), 1)
        h = (h[1:] if h.shape[0] > items.shape[1] else h).transpose(0, 1)
        return h, real[..., None]

    states, log_prob = hidden_and_log_prob(data.context)
    states_donor, log_prob_donor = hidden_and_log_prob(donor_context)
    per_block = []
    for h, h_donor in zip(states, states_donor):
        (h, weight), (h_donor, _) = per_outfit(h), per_outfit(h_donor)
        per_block.append(float(((h - h_donor) * weight).norm() / (h * weight).norm()))
    return {
        "block_change": per_block,
        "log_prob_change": float((log_prob - log_prob_donor).abs().mean()),
        "outfits": int(len(items)),
    }


def train_one(task: tuple[str, str, int, bool]) -> dict:
    """Train one (model, seed) of the cell whose params file is `task[0]`, and evaluate it on test unless
    `task[3]` is false (the sweep chooses on validation); its summary."""
    params_path, model, seed, evaluate = Path(task[0]), task[1], task[2], task[3]
    from contextual_bert.config import load_config
    from contextual_bert.evaluation import evaluate_run
    from contextual_bert.training import train

    cfg = load_config(params_path)
    run_dir = cfg.run_dir(model, seed)
    started = time.perf_counter()
    metrics = train(
        cfg.paths.features_dir, run_dir, model, seed, cfg.model_for(model), cfg.train_for(model), on_epoch_end=None
    )
    metrics_path = cfg.train_metrics_path(model, seed)
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    metrics_path.write_text(json.dumps(metrics, indent=2))
    summary = {
        "model": model,
        "seed": seed,
        "learning_rate": cfg.train_for(model).learning_rate,
        "best_val_cross_entropy": metrics["best_val_cross_entropy"],
        "epochs": metrics["epochs"],
        "best_epoch": metrics["best_epoch"],
        "converged": metrics["converged"],
        "parameters": metrics["parameters"],
    }
    if not evaluate:
        return summary | {"seconds": round(time.perf_counter() - started, 1)}
    report = evaluate_run(cfg.paths.features_dir, run_dir, cfg.eval_path(f"{model}-s{seed}"), cfg.evaluate)
    test, val = report["test"], report["val"]
    return summary | {
        "test_cross_entropy": test["cross_entropy"],
        "test_recall@1": test["recall@1"],
        "test_recall@5": test["recall@5"],
        "val_cross_entropy": val["cross_entropy"],
        "outfit_dependence": test.get("outfit_dependence"),
        "context_influence": context_influence(run_dir, cfg.paths.features_dir, cfg.model.max_set_size),
        "seconds": round(time.perf_counter() - started, 1),
    }


# --- cells ----------------------------------------------------------------------------------------------------


def prepare(root: Path, overrides: list[str], settings: dict) -> Project:
    """The cell's project with its data stages run (skipped when its features and yardsticks exist)."""
    project = Project(root, cell_params(overrides, root, settings))
    done = project.path("reports_dir") / "eval" / "optimum_context.json"
    if not done.exists():
        for stage in DATA_STAGES:
            project.stage(stage)
    return project


def yardsticks(project: Project) -> dict:
    out = {}
    for name in YARDSTICKS:
        path = project.path("reports_dir") / "eval" / f"{name}.json"
        result = json.loads(path.read_text())
        out[name] = result["test"]["cross_entropy"] if result.get("known", True) else None
    return out


def run_tasks(pool, tasks: list[tuple[str, str, int, bool]]) -> list[dict]:
    return list(pool.map(train_one, tasks))


def sweep(settings: dict, grid: dict[str, list[str]], work: Path, pool) -> dict[str, float]:
    """Each variant's rate, chosen on validation in the sweep's cell (seed `sweep.seed`); a choice at the grid's
    edge tries the declared next rate beyond it, once. Every run is recorded. The rates' projects share the
    cell's data (one data project; each rate's project reads its features)."""
    declared = settings["sweep"]
    data = prepare(work / "sweep" / "data", grid[declared["cell"]], settings)
    rates = list(declared["rates"])
    results: dict[str, dict[float, float]] = {m: {} for m in settings["variants"]}

    def run(models: list[str], rate: float) -> None:
        """The models at one rate, in one project that reads the data project's features."""
        root = work / "sweep" / f"rate-{rate}"
        rates = [f"per_model.{m}.learning_rate={rate}" for m in models]
        params = cell_params(grid[declared["cell"]] + rates, root, settings)
        params["paths"]["features_dir"] = str(data.path("features_dir"))
        project = Project(root, params)
        tasks = [(str(project.params_path), m, declared["seed"], False) for m in models]
        for model, result in zip(models, run_tasks(pool, tasks)):
            results[model][rate] = result["best_val_cross_entropy"]
            record(OUT, f"sweep/{model}/{rate}", result)

    for rate in rates:
        run(list(settings["variants"]), rate)
    beyond = {rates[0]: declared["edge"]["below"], rates[-1]: declared["edge"]["above"]}
    edges = [(m, beyond[min(r, key=r.get)]) for m, r in results.items() if min(r, key=r.get) in beyond]
    for rate in dict.fromkeys(rate for _, rate in edges):
        run([m for m, r in edges if r == rate], rate)
    choice = {m: min(r, key=r.get) for m, r in results.items()}
    record(OUT, "sweep/choice", {"cell": declared["cell"], "seed": declared["seed"], "rates": choice})
    return choice


def summarize(runs: list[dict], yards: dict) -> dict:
    from contextual_bert.evaluation import compare, mean_se

    rows = {}
    for model in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == model]
        rows[model] = {
            metric: mean_se([r[metric] for r in mine])
            for metric in ("test_cross_entropy", "test_recall@1", "test_recall@5", "outfit_dependence")
        } | {"converged": sum(r["converged"] is not None for r in mine), "runs": len(mine)}
    ce = {m: row["test_cross_entropy"] for m, row in rows.items()}
    pairs = [("global_state", "concat"), ("global_state_update", "concat"), ("global_state_two_way", "concat"),
             ("global_state_two_way", "global_state_update"), ("concat", "none"), ("new_position", "concat")]  # fmt: skip
    comparisons = {
        f"{a} vs {b}": compare(ce[a], ce[b], higher_is_better=False) for a, b in pairs if a in ce and b in ce
    }
    order = sorted(ce, key=lambda m: ce[m]["mean"])
    return {"rows": rows, "order": order, "comparisons": comparisons, "yardsticks": yards}


def run_cell(name: str, overrides: list[str], settings: dict, choice: dict, work: Path, pool) -> None:
    overrides = overrides + [f"per_model.{m}.learning_rate={r}" for m, r in choice.items()]
    project = prepare(work / name, overrides, settings)
    yards = yardsticks(project)
    record(OUT, f"{name}/optimum", yards)
    tasks = [(str(project.params_path), m, s, True) for m in settings["variants"] for s in settings["seeds"]]
    runs = run_tasks(pool, tasks)
    for r in runs:
        record(OUT, f"{name}/runs/{r['model']}-s{r['seed']}", r)
    project.stage("report")
    table1 = (project.path("reports_dir") / "table1.md").read_text().splitlines()
    record(OUT, f"{name}/table1", table1)
    record(OUT, f"{name}/summary", summarize(runs, yards))
    record(OUT, f"{name}/settings", {"set": overrides, "seconds": project.timings})


def run_supplement(settings: dict, grid: dict[str, list[str]], choice: dict, work: Path, pool) -> None:
    """`supplement` (declared after the map began, with its reason): the named models again at the given rates in
    the named cells, on the cell's own data; the cell's summary recomputed with them in place of the map's rows
    (`<cell>/supplement/summary`); the map's own entries are kept as they are."""
    declared = settings["supplement"]
    results = json.loads(OUT.read_text())
    for cell in declared["cells"]:
        root = work / f"{cell}-supplement"
        rates = [f"per_model.{m}.learning_rate={r}" for m, r in declared["rates"].items()]
        params = cell_params(grid[cell] + [f"per_model.{m}.learning_rate={r}" for m, r in choice.items()] + rates,
                             root, settings)  # fmt: skip
        params["paths"]["features_dir"] = str(work / cell / "data" / "features")
        project = Project(root, params)
        tasks = [(str(project.params_path), m, s, True) for m in declared["rates"] for s in settings["seeds"]]
        runs = run_tasks(pool, tasks)
        for r in runs:
            record(OUT, f"{cell}/supplement/runs/{r['model']}-s{r['seed']}", r)
        kept = [v for k, v in results.items() if k.startswith(f"{cell}/runs/") and v["model"] not in declared["rates"]]
        record(OUT, f"{cell}/supplement/summary", summarize(kept + runs, results[f"{cell}/optimum"]))


# --- the scale axis (issue 89) -------------------------------------------------------------------------------


def scale_cells(settings: dict, variants: list[str]) -> dict[str, list[str]]:
    """scale cell name ("<context>-<columns>-<size>") -> its --set overrides: the base's, the context and columns
    axes' values, the size's, and each of `variants`' declared batch and rate."""
    axes, scale = settings["axes"], settings["scale"]
    out = {}
    for name in scale["cells"]:
        context, columns, size = name.split("-")
        declared = scale["sizes"][size]
        rates = [f"per_model.{m}.{k}={v}" for m in variants for k, v in declared["rates"].items()]
        out[name] = (
            list(settings["base"]) + axes["context"][context] + axes["columns"][columns] + declared["set"] + rates
        )
    return out


def scale_params(overrides: list[str], root: Path, variants: list[str]) -> dict:
    """cell_params for the scale axis's `variants` (the declared ones the library knows)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for assignment in overrides:
        override(params, assignment)
    params["train"] |= {"num_threads": 1, "models": variants, "seeds": [0]}
    for model in variants:
        params["per_model"][model]["max_epochs"] = params["train"]["max_epochs"]
    return relocated(params, root)


def paired_rows(project: Project, runs: list[dict]) -> dict:
    """Each model's test cross-entropy (mean ± SE over its seeds) and per-outfit record, and the yardsticks'."""
    from contextual_bert.evaluation import OUTFITS_KEY, mean_record, mean_se

    evals = project.path("reports_dir") / "eval"
    rows = {}
    for model in dict.fromkeys(r["model"] for r in runs):
        mine = [json.loads((evals / f"{model}-s{r['seed']}.json").read_text()) for r in runs if r["model"] == model]
        rows[model] = (
            mean_se([e["test"]["cross_entropy"] for e in mine]),
            mean_record([e.get(OUTFITS_KEY) for e in mine]),
        )
    for name in YARDSTICKS:
        result = json.loads((evals / f"{name}.json").read_text())
        if result.get("known", True):
            rows[name] = (mean_se([result["test"]["cross_entropy"]]), result.get(OUTFITS_KEY))
    return rows


def scale_summary(project: Project, runs: list[dict], yards: dict) -> dict:
    """summarize() of the runs so far, and each model against popularity, the optimum and [C], and the
    global-state models and adaLN against the others: by the seed SE where both sides have seeds, else the paired
    bootstrap on the same test outfits (report_stats.compare)."""
    from contextual_bert.evaluation import compare

    out = summarize(runs, yards)
    rows = paired_rows(project, runs)
    models = [m for m in rows if m not in YARDSTICKS]
    pairs = [(m, y) for m in models for y in ("popularity", "optimum_context") if y in rows]
    pairs += [(m, "concat") for m in models if m != "concat"] + [(m, "none") for m in models if m != "none"]
    pairs += [(a, b) for a in ("adaptive_norm", "global_state_two_way") for b in ("global_state_update", "global_state")
              if a != b]  # fmt: skip
    out["paired"] = {
        f"{a} vs {b}": compare(rows[a][0], rows[b][0], False, "cross_entropy", (rows[a][1], rows[b][1]))
        for a, b in pairs
        if a in rows and b in rows
    }
    return out


def run_scale(settings: dict, work: Path, pool, groups: list | None = None) -> None:
    """The scale axis's runs in the declared order (`scale.order`: [cells, seeds] groups, every variant), one
    recorded as it lands; a run already in the results file is skipped, one begun before resumes from its last.pt
    (training.train). A model the library does not know yet is named and skipped. After each run its cell's
    summary is recomputed over the cell's runs so far."""
    from contextual_bert.config import VARIANTS

    variants = [m for m in settings["scale"]["variants"] if m in VARIANTS]
    grid = scale_cells(settings, variants)
    unknown = [m for m in settings["scale"]["variants"] if m not in VARIANTS]
    for cell_names, seeds in groups or settings["scale"]["order"]:
        for cell in cell_names:
            if unknown:
                print(f"{cell}: {', '.join(unknown)} not in this library; skipped", flush=True)
            project = Project(work / cell, scale_params(grid[cell], work / cell, variants))
            if not (project.path("reports_dir") / "eval" / "optimum_context.json").exists():
                for stage in DATA_STAGES:
                    project.stage(stage)
                record(OUT, f"{cell}/settings", {"set": grid[cell], "seconds": project.timings})
            yards = yardsticks(project)
            record(OUT, f"{cell}/optimum", yards)
            done = json.loads(OUT.read_text())
            tasks = [(str(project.params_path), m, s, True) for s in seeds for m in variants
                     if f"{cell}/runs/{m}-s{s}" not in done]  # fmt: skip
            for result in pool.map(train_one, tasks):
                record(OUT, f"{cell}/runs/{result['model']}-s{result['seed']}", result)
                runs = [v for k, v in json.loads(OUT.read_text()).items() if k.startswith(f"{cell}/runs/")]
                record(OUT, f"{cell}/summary", scale_summary(project, runs, yards))
                print(f"{cell} {result['model']}-s{result['seed']}: test CE {result['test_cross_entropy']:.4f} "
                      f"({result['epochs']} epochs, {result['seconds']:.0f} s)", flush=True)  # fmt: skip


# --- the findings' tables, from the results file -------------------------------------------------------------

LABELS = {"none": "[None]", "concat": "[C]", "new_position": "[NP]", "global_state": "[GS]",
          "global_state_update": "[GSU]", "global_state_two_way": "[GS2]", "adaptive_norm": "[AdaLN]"}  # fmt: skip


def _mean_se(stat: dict, scale: float = 1.0, digits: int = 3) -> str:
    if stat["mean"] is None:
        return "–"
    se = "" if stat["se"] is None else f" ± {stat['se'] * scale:.{digits}f}"
    return f"{stat['mean'] * scale:.{digits}f}{se}"


def render(results: dict) -> str:
    """Markdown: per cell, each model's test cross-entropy, recall@1, convergence, outfit dependence and the
    context's influence on the target's log-probability; then the comparisons the findings answer."""
    scale = set(results.get("scale/settings", {}).get("settings", {}).get("cells", []))
    cells = [k.removesuffix("/summary") for k in results if k.endswith("/summary") and "/supplement/" not in k]
    cells = [c for c in cells if c not in scale]  # the scale axis: render_scale
    lines = ["| cell | optimum with / without c | popularity | " + " | ".join(LABELS.values()) + " | order |",
             "| --- | --- | --- | " + " | ".join("---" for _ in LABELS) + " | --- |"]  # fmt: skip
    for cell in cells:
        summary, yards = results[f"{cell}/summary"], results[f"{cell}/optimum"]
        row = [
            cell,
            f"{yards['optimum_context']:.3f} / {yards['optimum_no_context']:.3f}",
            f"{yards['popularity']:.3f}",
        ]
        for model in LABELS:
            stat = summary["rows"].get(model)
            row.append("–" if stat is None else _mean_se(stat["test_cross_entropy"]))
        row.append(" > ".join(LABELS[m] for m in summary["order"]))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "| cell | " + " | ".join(results[f"{cells[0]}/summary"]["comparisons"]) + " |",
              "| --- | " + " | ".join("---" for _ in results[f"{cells[0]}/summary"]["comparisons"]) + " |"]  # fmt: skip
    for cell in cells:
        cells_text = []
        for c in results[f"{cell}/summary"]["comparisons"].values():
            mark = " **beats**" if c["beats_by_more_than_se"] else ""
            se = "" if c["se"] is None else f" ± {c['se']:.3f}"
            cells_text.append(f"{c['improvement']:+.3f}{se}{mark}")
        lines.append(f"| {cell} | " + " | ".join(cells_text) + " |")
    lines += [
        "",
        "| cell | " + " | ".join(f"{v} R@1 % / conv. / dep. / ctx" for v in LABELS.values()) + " |",
        "| --- | " + " | ".join("---" for _ in LABELS) + " |",
    ]
    for cell in cells:
        rows = results[f"{cell}/summary"]["rows"]
        runs = [v for k, v in results.items() if k.startswith(f"{cell}/runs/")]
        out = []
        for model in LABELS:
            if model not in rows:
                out.append("–")
                continue
            mine = [r for r in runs if r["model"] == model]
            influence = sum(r["context_influence"]["log_prob_change"] for r in mine) / len(mine)
            out.append(f"{_mean_se(rows[model]['test_recall@1'], 100, 1)} / {rows[model]['converged']}/"
                       f"{rows[model]['runs']} / {rows[model]['outfit_dependence']['mean']:.2f} / {influence:.2f}")  # fmt: skip
        lines.append(f"| {cell} | " + " | ".join(out) + " |")
    # where the context enters: each block's relative change under a donor's context, over every cell's runs
    runs = [v for k, v in results.items() if "/runs/" in k and "/supplement/" not in k and "context_influence" in v
            and k.split("/")[0] not in scale]  # fmt: skip
    lines += ["", "| model | block 1 | block 2 | block 3 | block 4 (masked position) | target log-prob |",
              "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for model in list(LABELS)[1:]:
        mine = [r["context_influence"] for r in runs if r["model"] == model and r["context_influence"]]
        if not mine:
            continue
        blocks = [sum(m["block_change"][b] for m in mine) / len(mine) for b in range(len(mine[0]["block_change"]))]
        change = sum(m["log_prob_change"] for m in mine) / len(mine)
        lines.append(f"| {LABELS[model]} | " + " | ".join(f"{b:.2f}" for b in blocks) + f" | {change:.2f} |")
    return "\n".join(lines)


def _paired_text(c: dict) -> str:
    """An improvement (positive: the first is better) with its SE or paired-bootstrap interval."""
    if c["yardstick"] == "se":
        return f"{c['improvement']:+.3f} ± {c['se']:.3f}" + (" **beats**" if c["beats_by_more_than_se"] else "")
    if c["yardstick"] == "paired bootstrap":
        low, high = c["ci"]
        return f"{c['improvement']:+.3f} [{low:+.3f}, {high:+.3f}]" + (
            " **beats**" if c["beats_by_more_than_se"] else ""
        )
    return f"{c['improvement']:+.3f}"


def render_scale(results: dict) -> str:
    """Markdown: per scale cell and model, test cross-entropy (± seed SE), and against popularity, the optimum
    with the context and [C] (improvement, positive = better, ± SE with seeds or [95% paired bootstrap] with one),
    outfit dependence, convergence."""
    cells = [
        c for c in results.get("scale/settings", {}).get("settings", {}).get("cells", []) if f"{c}/summary" in results
    ]
    lines = ["| cell | model | runs | test CE | vs popularity | vs optimum with c | vs [None] | vs [C] | dep. | conv. | s a run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for cell in cells:
        summary = results[f"{cell}/summary"]
        runs = [v for k, v in results.items() if k.startswith(f"{cell}/runs/")]
        for model in LABELS:
            row = summary["rows"].get(model)
            if row is None:
                continue
            paired = summary["paired"]
            vs = [paired.get(f"{model} vs {b}") for b in ("popularity", "optimum_context", "none", "concat")]
            seconds = [r["seconds"] for r in runs if r["model"] == model]
            lines.append(f"| {cell} | {LABELS[model]} | {row['runs']} | {_mean_se(row['test_cross_entropy'])} | "
                         + " | ".join("–" if c is None else _paired_text(c) for c in vs)
                         + f" | {row['outfit_dependence']['mean']:.2f} | {row['converged']}/{row['runs']} | "
                         f"{sum(seconds) / len(seconds):.0f} |")  # fmt: skip
    lines += ["", "| cell | comparison | improvement |", "| --- | --- | --- |"]
    for cell in cells:
        for name, c in results[f"{cell}/summary"]["paired"].items():
            first, second = name.split(" vs ")
            if first in ("adaptive_norm", "global_state_two_way") and second in ("global_state_update", "global_state"):
                lines.append(f"| {cell} | {LABELS[first]} vs {LABELS[second]} | {_paired_text(c)} |")
    # where the context enters, per cell: each block's relative change under a donor's context (mean over seeds)
    lines += ["", "| cell | model | block 1 | block 2 | block 3 | block 4 | target log-prob |",
              "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for cell in cells:
        runs = [v for k, v in results.items() if k.startswith(f"{cell}/runs/") and v.get("context_influence")]
        for model in list(LABELS)[1:]:
            mine = [r["context_influence"] for r in runs if r["model"] == model]
            if mine:
                blocks = [
                    sum(m["block_change"][b] for m in mine) / len(mine) for b in range(len(mine[0]["block_change"]))
                ]
                change = sum(m["log_prob_change"] for m in mine) / len(mine)
                lines.append(
                    f"| {cell} | {LABELS[model]} | " + " | ".join(f"{b:.2f}" for b in blocks) + f" | {change:.2f} |"
                )
    return "\n".join(lines)


def main() -> int:
    global OUT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=2, help="trainings at a time (one torch thread each)")
    parser.add_argument(
        "--only",
        choices=["sweep", "map", "supplement", "scale"],
        help="the sweep, the map, the supplement or the scale axis (issue 89)",
    )
    parser.add_argument(
        "--group",
        type=int,
        action="append",
        help="--only scale: the declared order's group(s) by index (default: all, in order)",
    )
    parser.add_argument("--settings", type=Path, default=SETTINGS, help="the declared grid (a trial: another file)")
    parser.add_argument("--out", type=Path, default=OUT, help="the results file")
    parser.add_argument("--render", action="store_true", help="print the findings' tables from --out and stop")
    parser.add_argument("--cells", help="comma-separated cell names (default: every cell, in the declared order)")
    args = parser.parse_args()

    OUT = args.out
    if args.render:
        results = json.loads(OUT.read_text())
        print(render_scale(results) if args.only == "scale" else render(results))
        return 0
    settings = yaml.safe_load(args.settings.read_text())
    grid = cells(settings)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    if args.only == "scale":  # the map's own `settings` entry (its commit) stays as it is
        record(OUT, "scale/settings", {"commit": commit.strip(), "settings": settings["scale"]})
    else:
        record(OUT, "settings", {"commit": commit.strip(), "settings": settings, "cells": list(grid)})
    os.environ["TQDM_DISABLE"] = "1"  # the workers' progress bars: thousands of lines in the log
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn"), initializer=_pin) as pool:
        if args.only in ("map", "supplement"):  # the scale axis declares its rates
            choice = json.loads(OUT.read_text())["sweep/choice"]["rates"]
        if args.only == "supplement":
            run_supplement(settings, grid, choice, args.work, pool)
            return 0
        if args.only == "scale":
            order = settings["scale"]["order"]
            run_scale(settings, args.work, pool, [order[i] for i in args.group] if args.group else None)
            return 0
        if args.only is None or args.only == "sweep":
            choice = sweep(settings, grid, args.work, pool)
        if args.only == "sweep":
            return 0
        names = args.cells.split(",") if args.cells else list(grid)
        for name in names:
            run_cell(name, grid[name], settings, choice, args.work, pool)
            print(f"{name}: {json.loads(OUT.read_text())[f'{name}/summary']['order']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
