"""The sweep through real DVC experiments on a toy project: queued, run, read back with `dvc exp show`, the
winner per model written into params.yaml; and the choice rules of contextual_bert.sweep."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest
import yaml
from flows_testkit import VENV_BIN, git, run

from contextual_bert.config import Config
from contextual_bert.sweep import choose, experiments, rows_from_exp_show, settings_grid

# A stand-in training: its validation cross-entropy is a parabola in log10(learning rate) with its minimum
# at 10^-2.5 for [None] and 10^-3 for [GS]; it writes reports/train/<model>-s<seed>.json as train does.
TOY_TRAIN = textwrap.dedent("""\
    import json, math, sys
    from pathlib import Path
    import yaml
    model, seed = sys.argv[1], sys.argv[2]
    params = yaml.safe_load(Path("params.yaml").read_text())
    lr = (params.get("per_model", {}).get(model) or {}).get("learning_rate") or params["train"]["learning_rate"]
    best = {"none": -2.5, "global_state": -3.0}[model]
    ce = 5.0 + (math.log10(lr) - best) ** 2
    Path("models").mkdir(exist_ok=True)
    Path(f"models/{model}-s{seed}.txt").write_text(str(lr))
    Path("reports/train").mkdir(parents=True, exist_ok=True)
    Path(f"reports/train/{model}-s{seed}.json").write_text(json.dumps(
        {"best_val_cross_entropy": ce, "converged": "plateau", "best_epoch": 3, "epochs": 4}))
    """)
TOY_DVC_YAML = textwrap.dedent("""\
    stages:
      train:
        matrix:
          model: ${train.models}
          seed: ${train.seeds}
        cmd: python toy_train.py ${item.model} ${item.seed}
        deps: [toy_train.py]
        params:
          - train.learning_rate
          - per_model.${item.model}
        outs:
          - models/${item.model}-s${item.seed}.txt
        metrics:
          - reports/train/${item.model}-s${item.seed}.json:
              cache: false
    """)
TOY_PARAMS = textwrap.dedent("""\
    # A toy project for the sweep: a valid contextual-bert params.yaml.
    train:
      models: [none, global_state]
      seeds: [0]
      learning_rate: 0.003   # the shared default
    per_model:
      none: {}
      global_state: {dropout: 0.1}   # a comment that must survive
    sweep:
      seed: 0
      grid:
        learning_rate: [0.0003, 0.001, 0.003]
    """)


def _toy_sweep_repo(root: Path) -> Path:
    root.mkdir(parents=True)
    git(["init", "-q", "-b", "main"], root)
    run([str(VENV_BIN / "dvc"), "init", "-q"], root)
    (root / "toy_train.py").write_text(TOY_TRAIN)
    (root / "dvc.yaml").write_text(TOY_DVC_YAML)
    (root / "params.yaml").write_text(TOY_PARAMS)
    (root / ".gitignore").write_text("__pycache__/\n")
    git(["add", "-A"], root)
    git(["commit", "-q", "-m", "toy sweep project"], root)
    return root


@pytest.mark.slow
def test_the_sweep_runs_dvc_experiments_and_writes_its_choice_into_params(prefect_api, tmp_path):
    from flows.sweep import sweep

    repo = _toy_sweep_repo(tmp_path / "toy")
    choice = sweep(workdir=str(repo), jobs=2)
    assert choice == {"none": {"learning_rate": 0.003}, "global_state": {"learning_rate": 0.001}}

    params_text = (repo / "params.yaml").read_text()
    params = yaml.safe_load(params_text)
    assert params["per_model"]["none"] == {"learning_rate": 0.003}
    assert params["per_model"]["global_state"] == {"dropout": 0.1, "learning_rate": 0.001}
    assert "# a comment that must survive" in params_text
    report = json.loads((repo / "reports/sweep/sweep.json").read_text())
    assert len(report["rows"]) == 6 and report["choice"] == choice
    assert (repo / "reports/sweep/sweep.png").stat().st_size > 0
    assert "**5.0000**" in (repo / "reports/sweep/sweep.md").read_text()  # [GS] at 1e-3: its minimum


def _cfg(**sweep) -> Config:
    return Config.model_validate(
        {"train": {"models": ["none", "global_state"], "seeds": [0, 1]}, "sweep": {"seed": 1, **sweep}}
    )


def test_the_grid_is_every_combination_for_every_model():
    cfg = _cfg(grid={"learning_rate": [1e-3, 2e-3], "dropout": [0.1, 0.2, 0.3]}, models=["global_state"])
    assert len(settings_grid(cfg)) == 6
    planned = experiments(cfg)
    assert [e["target"] for e in planned] == ["train@global_state-1"] * 6
    assert planned[1]["set_params"] == [
        "++per_model.global_state.learning_rate=0.001",
        "++per_model.global_state.dropout=0.2",
    ]
    with pytest.raises(Exception, match="sweep.seed 5 is not one of train.seeds"):
        experiments(_cfg(seed=5))


def test_a_model_may_have_its_own_grid():
    cfg = _cfg(grid={"learning_rate": [1e-3, 2e-3]}, grids={"none": {"learning_rate": [5e-3, 1e-2, 2e-2]}})
    planned = experiments(cfg)
    assert [(e["model"], e["setting"]["learning_rate"]) for e in planned] == [
        ("none", 5e-3),
        ("none", 1e-2),
        ("none", 2e-2),
        ("global_state", 1e-3),
        ("global_state", 2e-3),
    ]
    assert [e["name"] for e in planned][:3] == ["sweep-none-0", "sweep-none-1", "sweep-none-2"]
    with pytest.raises(Exception, match=r"sweep.grids names \['concat'\], which the sweep does not train"):
        experiments(_cfg(grids={"concat": {"learning_rate": [1e-3]}}))


def test_choose_takes_the_lowest_validation_loss_and_skips_failed_runs():
    cfg = _cfg(grid={"learning_rate": [1e-3, 2e-3]})
    metrics_file = str(cfg.train_metrics_path("none", 1))

    def exp(name, lr, ce):
        return {
            "name": name,
            "rev": name,
            "data": {
                "params": {"params.yaml": {"data": {"per_model": {"none": {"learning_rate": lr}}}}},
                "metrics": {metrics_file: {"data": {"best_val_cross_entropy": ce, "converged": None}}},
            },
        }

    shown = [
        {
            "name": "workspace",
            "data": {},
            "experiments": [
                {"revs": [exp("sweep-none-0", 0.001, 5.2)]},
                {"revs": [exp("sweep-none-1", 0.002, 5.1)]},
                {"revs": [exp("unrelated", 0.5, 1.0)]},
                {"revs": [exp("sweep-none-1", 0.002, math.inf)]},
            ],
        }
    ]
    rows = rows_from_exp_show(shown, cfg)
    assert [r["experiment"] for r in rows] == ["sweep-none-0", "sweep-none-1"]
    assert choose(rows) == {"none": {"learning_rate": 0.002}}


def test_an_earlier_sweeps_experiment_of_the_same_name_is_not_read():
    cfg = _cfg(grid={"learning_rate": [1e-3, 2e-3]})
    metrics_file = str(cfg.train_metrics_path("none", 1))

    def exp(name, lr, ce, when):
        return {
            "name": name,
            "rev": f"{name}@{when}",
            "data": {
                "timestamp": when,
                "params": {"params.yaml": {"data": {"per_model": {"none": {"learning_rate": lr}}}}},
                "metrics": {metrics_file: {"data": {"best_val_cross_entropy": ce, "converged": None}}},
            },
        }

    # `dvc exp show -A`: the old commit's sweep (other data) first, then this one's
    shown = [
        {
            "name": "old",
            "data": {},
            "experiments": [{"revs": [exp("sweep-none-0", 0.001, 3.0, "2026-11-22T10:00:00")]}],
        },
        {
            "name": "new",
            "data": {},
            "experiments": [
                {"revs": [exp("sweep-none-1", 0.002, 5.1, "2026-11-23T10:05:00")]},
                {"revs": [exp("sweep-none-0", 0.001, 5.2, "2026-11-23T10:00:00")]},
            ],
        },
    ]
    rows = rows_from_exp_show(shown, cfg)
    assert [(r["experiment"], r["best_val_cross_entropy"]) for r in rows] == [
        ("sweep-none-0", 5.2),
        ("sweep-none-1", 5.1),
    ]
    assert choose(rows) == {"none": {"learning_rate": 0.002}}


FAKE_DVC = """#!/bin/bash
# `dvc queue start` as DVC does it: a detached worker that keeps the command's stdout and stderr open
case "$1 $2" in
  "queue start") (sleep 120 & echo $! > "$PWD/worker.pid") ; exit 0 ;;
  "queue status") echo "Worker status: 0 active, 0 idle" ;;
  "queue stop") kill "$(cat "$PWD/worker.pid")" ; echo stopped > "$PWD/stopped" ;;
esac
"""


def test_run_queue_does_not_wait_for_the_detached_workers(tmp_path, monkeypatch):
    """Reading `dvc queue start`'s output waited until its detached worker exited; an idle worker never did,
    and the sweep hung. Its output goes to a log file, and the workers are stopped once the queue is empty."""
    import subprocess
    import sys
    import threading

    from flows.sweep import run_queue

    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "dvc").write_text(FAKE_DVC)
    (fake_bin / "dvc").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake_bin / "python"))  # _dvc puts this folder first on PATH
    workdir = tmp_path / "repo"
    workdir.mkdir()
    done = threading.Thread(target=run_queue, args=(workdir, 2), kwargs={"poll_s": 0.1}, daemon=True)
    done.start()
    done.join(timeout=60)  # the worker lives 120 s: waiting for it would outlast this
    if done.is_alive():
        subprocess.run(["kill", (workdir / "worker.pid").read_text().strip()])
    assert not done.is_alive(), "run_queue waited for the detached queue worker"
    assert (workdir / "stopped").exists(), "the queue's workers were not stopped"


def test_the_sweep_may_choose_how_the_article_embeddings_start():
    cfg = _cfg(grid={"learning_rate": [1e-3], "init_embeddings": ["random", "cooccurrence"]}, models=["none"])
    planned = experiments(cfg)
    assert [e["setting"] for e in planned] == [
        {"learning_rate": 1e-3, "init_embeddings": "random"},
        {"learning_rate": 1e-3, "init_embeddings": "cooccurrence"},
    ]
    assert planned[1]["set_params"] == [
        "++per_model.none.learning_rate=0.001",
        "++per_model.none.init_embeddings=cooccurrence",
    ]
    with pytest.raises(Exception, match="init_embeddings"):
        _cfg(grid={"init_embeddings": ["glove"]})
    with pytest.raises(Exception, match="sweep.grid.learning_rate takes numbers"):
        settings_grid(_cfg(grid={"learning_rate": ["random"]}))
