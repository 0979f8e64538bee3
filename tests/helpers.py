"""Helpers shared by test modules (import them with `from helpers import ...`; fixtures live in conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # `import flows` (a top-level folder)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.infra.net import free_port  # noqa: E402,F401 - the one free-port helper, for the tests

TINY_MODEL = {"d_model": 32, "n_blocks": 2, "n_heads": 4, "d_ff": 64, "dropout": 0.1, "max_set_size": 8}
STRONG, WEAK = ("global_state", 0), ("none", 0)
# The plain training the tests' small runs were written for: the full softmax, light weight decay, no bag
# warm-up (params.yaml's recipe, TrainConfig's defaults, turns these on; a test of one of them sets it)
PLAIN_TRAIN = {"weight_decay": 0.01, "softmax": "full", "bag_warmup_epochs": 0, "bag_warmup_check_steps": None}


def wake_between_blocks(model) -> None:
    """[GSU]'s updates and [GS2]'s reads of the state between blocks, their norms' gains and biases drawn at random
    as training moves them, and [AdaLN]'s regressions of each block's shifts, scales and gates: at their zero start
    they are the identity and hide what they compute."""
    import torch

    with torch.no_grad():
        for between in (getattr(model, "global_state_reads", None), getattr(model, "global_state_updates", None)):
            for module in between or []:
                module.norm.weight.normal_()
                module.norm.bias.normal_(std=0.1)
        for block in getattr(model, "blocks", None) or []:
            if getattr(block, "modulation", None) is not None:
                block.modulation.linear.weight.normal_(std=0.3)
                block.modulation.linear.bias.normal_(std=0.3)


def with_registry_settings(cfg, model_name, models, **promote_settings):
    """`cfg` with its own registered model name, the models to register and promote settings."""
    return cfg.model_copy(
        update={
            "mlflow": cfg.mlflow.model_copy(update={"model_name": model_name}),
            "train": cfg.train.model_copy(update={"models": models}),
            "promote": cfg.promote.model_copy(update=promote_settings),
        }
    )


@dataclass(frozen=True)
class TinyProject:
    root: Path
    params: Path  # the project's params.yaml (absolute paths into root)

    @property
    def cfg(self):
        from contextual_bert.config import load_config

        return load_config(self.params)

    @property
    def features_dir(self) -> Path:
        return self.root / "data" / "features"


def wait_for_http(url: str, process: subprocess.Popen, timeout: float) -> None:
    """Poll `url` until it answers 200; fail when the server exits or `timeout` seconds pass."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout} s")


def stop_process_group(process: subprocess.Popen) -> None:
    """Stop a server started with start_new_session=True: its group is it and the workers it started."""
    import signal

    try:
        os.killpg(process.pid, signal.SIGTERM)  # the server and the workers it started, nothing else
    except ProcessLookupError:  # the whole group has exited already
        return
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


HM_FIXTURE_FILES = ("articles", "customers", "transactions_train")


def hm_fixture(directory: Path) -> Path:
    """The hand-written H&M-format fixture, laid out in `directory` under the Kaggle file names.

    Stored as tests/fixtures/hm/<name>.fixture.csv so that nothing in git looks like real H&M data.
    """
    source = Path(__file__).parent / "fixtures" / "hm"
    directory.mkdir(parents=True, exist_ok=True)
    for name in HM_FIXTURE_FILES:
        (directory / f"{name}.csv").write_bytes((source / f"{name}.fixture.csv").read_bytes())
    return directory


REPO = Path(__file__).resolve().parents[1]


def dvc_project(project: Path, **env) -> tuple[Path, dict]:
    """A DVC project in `project` made of this repo's dvc.yaml, params.yaml, .dvcignore and src/ (`dvc init --no-scm`); the
    dvc executable and an environment that runs that src/ (plus `env`)."""
    project.mkdir(parents=True)
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, project / name)
    shutil.copytree(REPO / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    env.pop("DVC_NO_ANALYTICS", None)
    subprocess.run([str(bin_dir / "dvc"), "init", "--no-scm", "-q"], cwd=project, check=True, env=env)
    # the repo's: dvc.yaml's folder deps (src/contextual_bert) must not see the bytecode a stage writes there
    shutil.copy(REPO / ".dvcignore", project / ".dvcignore")
    return bin_dir / "dvc", env
