"""Shared, session-scoped fixtures: a tiny project built with the real pipeline, once per test session.

`tiny_project`: generate (tiny size) -> validate -> features into a temporary folder, with a params.yaml whose
paths point there and whose model is small (d_model 32, 2 blocks), so stages run in seconds.
`tiny_trained_runs`: two trainings through the CLI (`contextual-bert train` + `evaluate`, logged to MLflow):
'global_state' seed 0, trained properly, and 'none' seed 0 with a learning rate so small that it stays
near its initialisation - a clearly weaker model, which the promotion tests need.

Every test session logs to its own SQLite MLflow store (MLFLOW_TRACKING_URI set for the whole session), so
no test writes mlflow.db or mlruns/ in the repository.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml
from helpers import PLAIN_TRAIN, STRONG, TINY_MODEL, WEAK, TinyProject

# The tests mirror src/'s packages, in folders without __init__.py: a test that imports another's helpers
# (`from test_training import new_model`) finds it in whichever folder it lies.
TESTS = Path(__file__).resolve().parent
sys.path[:0] = [
    str(d)
    for d in sorted(TESTS.iterdir())
    if d.is_dir()
    and d.name in ("data", "model", "training", "evaluation", "registry", "serving")
    and str(d) not in sys.path
]


@pytest.fixture
def one_torch_thread():
    """For tests of tiny models, where a second thread only adds synchronisation."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def mlflow_tracking_uri(tmp_path_factory):
    """A SQLite MLflow store of this session's own; the previous MLFLOW_TRACKING_URI is restored after."""
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    uri = f"sqlite:///{db}"
    before = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    yield uri
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


def _params(root: Path) -> dict:
    return {
        "paths": {
            "raw_dir": str(root / "data/raw"),
            "validated_dir": str(root / "data/validated"),
            "quarantine_dir": str(root / "data/quarantine"),
            "features_dir": str(root / "data/features"),
            "models_dir": str(root / "models"),
            "reports_dir": str(root / "reports"),
        },
        "generate": {"size": "tiny", "seed": 0},
        "features": {"default_dim": 8, "embedding_dims": {}},
        "model": TINY_MODEL,
        "train": {
            "models": [STRONG[0], WEAK[0]],
            "seeds": [0],
            "batch_size": 128,
            "max_epochs": 3,
            "learning_rate": 0.003,
            "lr_warmup_steps": 10,
            "device": "cpu",
            "num_threads": 1,  # the machine is shared: one thread per training avoids oversubscription
            **PLAIN_TRAIN,
        },
        # The weak model: a learning rate that leaves it near its random initialisation. The strong one: epochs
        # enough to count better than popularity on validation (at 3 it does not: promotion would refuse it).
        "per_model": {WEAK[0]: {"learning_rate": 1.0e-7, "max_epochs": 1}, STRONG[0]: {"max_epochs": 10}},
        "mlflow": {"experiment": "tests", "model_name": "outfit-completion", "top_k": 10},
    }


@pytest.fixture(scope="session")
def tiny_project(tmp_path_factory) -> TinyProject:
    """generate -> validate -> features through the CLI stages, tiny size."""
    from contextual_bert.cli import main

    root = tmp_path_factory.mktemp("project")
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump(_params(root)))
    for stage in ("generate", "validate", "features"):
        assert main(["--params", str(params), stage]) == 0, stage
    return TinyProject(root, params)


@pytest.fixture(scope="session")
def tiny_trained_runs(tiny_project) -> TinyProject:
    """Both trainings of the tiny project, through the CLI: trained, evaluated and tracked in MLflow."""
    from contextual_bert.cli import main

    for model, seed in (STRONG, WEAK):
        for stage in ("train", "evaluate"):
            code = main(["--params", str(tiny_project.params), stage, "--model", model, "--seed", str(seed)])
            assert code == 0, f"{stage} {model}-s{seed} failed"
    return tiny_project
