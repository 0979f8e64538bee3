"""A run's identity and exact resume: the run key (what must match for last.pt to be resumed, the library's code
included), every random stream, and last.pt itself.

Determinism: one seed fixes the initial weights, the shuffling and masking (a generator of its own) and dropout
(the global generator). The thread count is a setting (train.num_threads): how a reduction is split over
threads changes its rounding. torch's deterministic algorithms are on (`pin_threads_and_algorithms`).

Exact resume: last.pt holds everything that changes during a run - weights, optimizer, scheduler, every random
stream (the run's generator, torch's, CUDA's, numpy's, Python's), history and early-stopping state - after
every epoch, and within an epoch every train.checkpoint_every_s seconds with the position in the epoch. A run
killed at any moment and resumed ends with the same history, metrics and weights, bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np
import torch

from contextual_bert.config import TrainConfig
from contextual_bert.data.feature_spec import EncodedOutfits
from contextual_bert.model.checkpoint import atomic_save

# Settings a run can change and still be resumed: they do not change what an epoch computes. (The device
# the run trains on is part of the key instead: its random streams differ; so is num_threads: it changes the
# rounding.) (max_epochs is not among them: it sets the decay's horizon.)
RESUMABLE_CHANGES = ("variants", "seeds", "patience", "device", "checkpoint_every_s")


def _data_fingerprint(data: EncodedOutfits) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in [("items", data.items), *sorted(data.context.items())]:
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # src/contextual_bert


def code_digest() -> str:
    """SHA-256 of every source file of the library, its subpackages' included, by path. Part of the run key:
    DVC re-runs a training when code it runs changed, and a finished last.pt of the old code must not then pass
    for the new run."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def run_key(model, train_cfg: TrainConfig, seed: int, train_data, val_data, device) -> dict:
    """What must match for last.pt to be resumed; anything else starts the run afresh."""
    train_settings = train_cfg.read_by(model.variant, exclude=set(RESUMABLE_CHANGES))
    return {
        "code": code_digest(),
        "device": torch.device(device).type,
        "model_config": model.model_cfg.model_dump(),
        "variant": model.variant,
        "n_items": model.n_items,
        "spec": model.spec.to_json(),
        "train": train_settings,
        "seed": seed,
        "train_data": _data_fingerprint(train_data),
        "val_data": _data_fingerprint(val_data),
    }


def pin_threads_and_algorithms(train_cfg: TrainConfig) -> None:
    """Compute with train.num_threads threads (a recorded setting, never the machine's default) and torch's
    deterministic algorithms (docs/reproducibility.md: what they cost)."""
    torch.set_num_threads(train_cfg.num_threads)
    # cuBLAS is deterministic only with a fixed workspace, set before its first call (harmless on the CPU)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


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
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached_gaussian)},
        "python": random.getstate(),
    }


def restore_random_states(states: dict, generator: torch.Generator, device: torch.device) -> None:
    generator.set_state(states["generator"])
    torch.set_rng_state(states["torch"])
    if device.type == "cuda" and states["cuda"] is not None:
        torch.cuda.set_rng_state(states["cuda"], device)
    numpy = states["numpy"]
    np.random.set_state(("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["cached_gaussian"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


def save_resume_state(path: Path, key: dict, model, optimizer, scheduler, generator, device, state: dict,
                      position: dict | None = None) -> None:
    """last.pt: all a run needs to go on exactly. `position` is None at an epoch's end; within an epoch it
    holds the epoch, the steps done, the generator's state at the epoch's start and the loss summed so far."""
    atomic_save(
        {
            "run_key": key,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "random": random_states(generator, device),
            "state": state,
            "position": position,
        },
        path,
    )


def load_resume_state(path: Path, key: dict, model, optimizer, scheduler, generator, device):
    """Restore last.pt when it belongs to the run `key`: returns (state, position, random states), the last two
    for a run stopped within an epoch (else None). Returns None and removes the run's files when last.pt is
    another run's (other settings or data): the run starts afresh."""
    if not path.exists():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if saved.get("run_key") != key or "random" not in saved:  # another run's, or written before exact resume
        for stale in ("last.pt", "checkpoint.pt", "history.json", "metrics.json"):
            (path.parent / stale).unlink(missing_ok=True)
        return None
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    restore_random_states(saved["random"], generator, device)
    return saved["state"], saved["position"], saved["random"]


def write_json(path: Path, obj) -> None:
    atomic_save(json.dumps(obj, indent=2), path, write=lambda text, tmp: Path(tmp).write_text(text))
