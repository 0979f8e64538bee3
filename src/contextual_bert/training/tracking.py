"""What a training reports as it goes: a progress bar over each epoch's outfits, and every epoch's row of the
curve to the caller's hook (the CLI's: the MLflow tracker's `log_epoch`, registry/tracking.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

EpochHook = Callable[[int, dict], None]  # (epoch, its row of the curve)
POSTFIX_EVERY = 20  # steps between the bar's loss and speed (reading the loss waits for the device)


class Tracking:
    """The bar (labelled by the model) and the epoch hook (None: none)."""

    def __init__(self, label: str, on_epoch_end: EpochHook | None = None):
        self.label, self.on_epoch_end = label, on_epoch_end
        self.bar: tqdm | None = None

    def start_epoch(self, epoch: int, n_outfits: int) -> None:
        self.bar = tqdm(total=n_outfits, desc=f"{self.label} epoch {epoch}", unit="outfit", leave=False,
                        mininterval=1.0, dynamic_ncols=True)  # fmt: skip

    def step(self, step: int, n_steps: int, n_outfits: int, loss: torch.Tensor, started: float) -> None:
        """After step `step` (0-based) of `n_steps`, of `n_outfits` outfits; `started`: the epoch's start."""
        assert self.bar is not None, "a step is tracked within an epoch"
        self.bar.update(n_outfits)
        if step % POSTFIX_EVERY == 0 or step == n_steps - 1:
            elapsed = time.perf_counter() - started
            self.bar.set_postfix(loss=f"{float(loss):.3f}", samples_per_s=f"{self.bar.n / max(elapsed, 1e-9):.0f}")

    def end_epoch(self, epoch: int, row: dict) -> None:
        """The epoch's row, complete: the bar closed, the hook called."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.on_epoch_end is not None:
            self.on_epoch_end(epoch, row)
