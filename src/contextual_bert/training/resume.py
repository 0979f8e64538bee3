"""A run's identity and exact resume: the run key (what must match for last.pt to be resumed, the library's code
included), every random stream, and last.pt itself.

Determinism: one seed fixes the initial weights, the shuffling and masking (a generator of its own) and dropout
(the global generator). The thread count is a setting (train.num_threads): how a reduction is split over
threads changes its rounding. torch's deterministic algorithms are on (`pin_threads_and_algorithms`).

Exact resume: last.pt holds everything that changes during a run - weights, optimizer, scheduler, every random
stream (the run's generator, torch's, CUDA's, numpy's, Python's) and the run's state (`RunState`: its curve,
early stopping, the bag warm-up) - after every epoch, and within an epoch every train.checkpoint_every_s seconds
with the position in the epoch (`Position`). A run killed at any moment and resumed ends with the same curve,
metrics and weights, bit for bit. last.pt carries CHECKPOINT_VERSION: one of another version is never resumed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from contextual_bert.config import CHECKPOINT_FILE, CURVE_FILE, LAST_FILE, METRICS_FILE, TrainConfig
from contextual_bert.data.feature_spec import EncodedOutfits
from contextual_bert.model.checkpoint import CHECKPOINT_VERSION, atomic_save
from contextual_bert.training.warmup import BagWarmup

RUN_FILES = (CHECKPOINT_FILE, LAST_FILE, CURVE_FILE, METRICS_FILE)

# Settings a run can change and still be resumed: they do not change what an epoch computes. (The device
# the run trains on is part of the key instead: its random streams differ; so is num_threads: it changes the
# rounding.) (max_epochs is not among them: it sets the decay's horizon.)
RESUMABLE_CHANGES = ("models", "seeds", "patience", "device", "checkpoint_every_s")


def _tensors_fingerprint(tensors: list[tuple[str, torch.Tensor]]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in tensors:
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _data_fingerprint(data: EncodedOutfits) -> str:
    return _tensors_fingerprint([("items", data.items), *sorted(data.context.items())])


def _catalogue_key(model) -> dict:
    """An "_attrs" model's catalogue: its attributes' spec and every article's encoded values (a vector's numbers
    included), which the model reads as it reads the outfits; a model of ids has none."""
    if model.attributes is None:
        return {}
    catalogue = model.attributes.catalogue()
    return {"attributes": model.attributes.spec.to_json(), "catalogue": _tensors_fingerprint(sorted(catalogue.items()))}


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # src/contextual_bert


def code_digest() -> str:
    """SHA-256 of every source file of the library, its subpackages' included, by path. Part of the run key:
    DVC re-runs a training when code it runs changed, and a finished last.pt of the old code must not then pass
    for the new run."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@dataclass
class RunState:
    """What a run has done so far, saved in last.pt: the last epoch done, the training curve (a row per epoch),
    early stopping, its seconds and the bag warm-up."""

    epoch: int = 0
    curve: list[dict] = field(default_factory=list)
    best_val: float = math.inf
    best_epoch: int = 0
    bad_epochs: int = 0
    stopped: bool = False
    seconds: float = 0.0
    bag_warmup: BagWarmup = field(default_factory=BagWarmup)

    def record(self, row: dict) -> bool:
        """The epoch's row (validated) added to the curve and early stopping; whether it is the best so far."""
        self.curve.append(row)
        self.epoch, self.seconds = row["epoch"], self.seconds + row["seconds"]
        if row["val_cross_entropy"] < self.best_val:
            self.best_val, self.best_epoch, self.bad_epochs = row["val_cross_entropy"], row["epoch"], 0
            return True
        self.bad_epochs += 1
        return False

    def stops(self, patience: int) -> bool:
        """Early stopping: `patience` epochs without a better validation cross-entropy; never within a warm-up
        (it is judged at its end)."""
        return self.bad_epochs >= patience and self.bag_warmup.phase != "running"

    def to_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "curve": self.curve,
            "best_val": self.best_val,
            "best_epoch": self.best_epoch,
            "bad_epochs": self.bad_epochs,
            "stopped": self.stopped,
            "seconds": self.seconds,
            "bag_warmup": self.bag_warmup.to_dict(),
        }

    @classmethod
    def from_dict(cls, saved: dict) -> RunState:
        return cls(**{**saved, "bag_warmup": BagWarmup.from_dict(saved["bag_warmup"])})


@dataclass
class Position:
    """Where within an epoch a run was saved: the steps done, the generator's state at the epoch's start (its
    batches), the loss summed so far over n_targets and the epoch's seconds."""

    epoch: int
    step: int
    epoch_generator: torch.Tensor
    loss_sum: torch.Tensor
    n_targets: int
    seconds: float

    def to_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "epoch_generator": self.epoch_generator,
            "loss_sum": self.loss_sum,
            "n_targets": self.n_targets,
            "seconds": self.seconds,
        }


def run_key(model, train_cfg: TrainConfig, seed: int, train_data, val_data, device) -> dict:
    """What must match for last.pt to be resumed; anything else starts the run afresh."""
    train_settings = train_cfg.read_by(model.name, exclude=set(RESUMABLE_CHANGES))
    return {
        "code": code_digest(),
        "device": torch.device(device).type,
        "model_config": model.model_cfg.model_dump(),
        "model": model.name,
        "n_items": model.n_items,
        "spec": model.spec.to_json(),
        "train": train_settings,
        "seed": seed,
        "train_data": _data_fingerprint(train_data),
        "val_data": _data_fingerprint(val_data),
        **_catalogue_key(model),
    }


def pin_threads_and_algorithms(train_cfg: TrainConfig) -> None:
    """Compute with train.num_threads threads (a recorded setting, never the machine's default) and torch's
    deterministic algorithms (docs/reproducibility.md: what they cost)."""
    torch.set_num_threads(train_cfg.num_threads)
    # cuBLAS is deterministic only with a fixed workspace, set before its first call (harmless on the CPU)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # torch.use_deterministic_algorithms also sets inductor's flag, whose import costs ~1.4 s a process; nothing
    # here compiles, so torch's own switch alone is the same setting for every op a training runs
    torch._C._set_deterministic_algorithms(True, warn_only=True)


def seeded_random_states(seed: int, device: torch.device) -> torch.Generator:
    """Seed every random stream from the run's seed; returns the run's own generator (shuffling, masking).
    torch's global generator draws dropout; numpy's and Python's are seeded too, though the loop draws from
    neither, so that nothing a step might call depends on the process."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    return generator


def random_states(generator: torch.Generator, device: torch.device) -> dict:
    """Every random stream a step may draw from: the run's generator (shuffling, masking), torch's global one
    (dropout, id dropout), CUDA's, numpy's and Python's (the loop draws from neither; saved so that code which
    does cannot break an exact resume). Tensors and plain values only: last.pt loads with weights_only."""
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "generator": generator.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": {
            "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": random.getstate(),
    }


def restore_random_states(states: dict, generator: torch.Generator, device: torch.device) -> None:
    generator.set_state(states["generator"])
    torch.set_rng_state(states["torch"])
    if device.type == "cuda" and states["cuda"] is not None:
        torch.cuda.set_rng_state(states["cuda"], device)
    numpy = states["numpy"]
    np.random.set_state(
        ("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"], numpy["cached_gaussian"])
    )
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


def save_resume_state(
    path: Path,
    key: dict,
    model,
    optimizer,
    scheduler,
    generator,
    device,
    state: RunState,
    position: Position | None = None,
) -> None:
    """last.pt: all a run needs to go on exactly. `position` is None at an epoch's end."""
    atomic_save(
        {
            "version": CHECKPOINT_VERSION,
            "run_key": key,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "random": random_states(generator, device),
            "state": state.to_dict(),
            "position": None if position is None else position.to_dict(),
        },
        path,
    )


def load_resume_state(
    path: Path, key: dict, model, optimizer, scheduler, generator, device
) -> tuple[RunState, Position | None, dict | None] | None:
    """Restore last.pt when it belongs to the run `key`: returns (state, position, random states), the last two
    for a run stopped within an epoch (else None). Returns None and removes the run's files when last.pt is
    another run's (other settings or data) or of another CHECKPOINT_VERSION (with a one-line warning naming it,
    never loaded): the run starts afresh."""
    if not path.exists():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=True)
    version = saved.get("version")
    if version != CHECKPOINT_VERSION:
        warnings.warn(
            f"{path}: resume state version {version} (this code reads version {CHECKPOINT_VERSION}); not "
            "resumed, the run starts afresh",
            stacklevel=2,
        )
    if version != CHECKPOINT_VERSION or saved["run_key"] != key:
        for stale in RUN_FILES:
            (path.parent / stale).unlink(missing_ok=True)
        return None
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    restore_random_states(saved["random"], generator, device)
    position = None if saved["position"] is None else Position(**saved["position"])
    return RunState.from_dict(saved["state"]), position, None if position is None else saved["random"]


def write_json(path: Path, obj: Any) -> None:
    atomic_save(json.dumps(obj, indent=2), path, write=lambda text, tmp: Path(tmp).write_text(text))
