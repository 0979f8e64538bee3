"""A run's files, written at the trainer's fixed points: last.pt (the resume state: after every epoch, and within
one every train.checkpoint_every_s seconds), checkpoint.pt (the best validation cross-entropy's weights),
curve.json (a row per epoch) and metrics.json (the result)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from contextual_bert.model import OutfitModel, save_checkpoint
from contextual_bert.training.resume import (
    CHECKPOINT_FILE,
    CURVE_FILE,
    LAST_FILE,
    METRICS_FILE,
    Position,
    load_resume_state,
    save_resume_state,
    write_json,
)
from contextual_bert.training.run import Run


class Checkpoints:
    """The files of the run in `out_dir`; `every_s`: train.checkpoint_every_s (0: last.pt at epochs' ends only)."""

    def __init__(self, out_dir: Path, every_s: float):
        self.out_dir, self.every_s = Path(out_dir), every_s
        self.saved_at = time.perf_counter()

    @property
    def last_path(self) -> Path:
        return self.out_dir / LAST_FILE

    @property
    def best_path(self) -> Path:
        return self.out_dir / CHECKPOINT_FILE

    def resume(self, run: Run) -> tuple[Position, dict] | None:
        """Restore last.pt into `run` when it is this run's (its key); the position within an epoch and the random
        states there when it was saved mid-epoch (else None). Another run's last.pt is removed (resume.py)."""
        model, optim = run.setup.model, run.optim
        resumed = load_resume_state(
            self.last_path, run.setup.key, model, optim.optimizer, optim.scheduler, optim.generator, run.setup.device
        )
        if resumed is None:
            return None
        run.state, position, random = resumed
        return None if position is None or random is None else (position, random)

    def epoch_started(self) -> None:
        self.saved_at = time.perf_counter()

    def due(self, step: int, n_steps: int) -> bool:
        """Is a mid-epoch last.pt due after `step` (0-based) of `n_steps`? Never after the last: the epoch's end saves."""
        return self.every_s > 0 and step + 1 < n_steps and time.perf_counter() - self.saved_at >= self.every_s

    def save_last(self, run: Run, position: Position | None = None) -> None:
        """last.pt: at an epoch's end (`position` None) or within one."""
        optim = run.optim
        save_resume_state(self.last_path, run.setup.key, run.setup.model, optim.optimizer, optim.scheduler,
                          optim.generator, run.setup.device, run.state, position)  # fmt: skip
        self.saved_at = time.perf_counter()

    def save_best(self, model: OutfitModel, meta: dict[str, Any]) -> None:
        save_checkpoint(self.best_path, model, meta)

    def write_curve(self, curve: list[dict]) -> None:
        write_json(self.out_dir / CURVE_FILE, curve)

    def write_metrics(self, metrics: dict) -> None:
        write_json(self.out_dir / METRICS_FILE, metrics)
