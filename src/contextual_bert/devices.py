"""Where the model runs: choosing the device, bf16 autocast on CUDA, and glibc's memory reuse on the CPU.

Training, evaluation and serving all go through these helpers, so that one setting means the same thing
everywhere ("auto" = CUDA when there is one).
"""

from __future__ import annotations

import ctypes
import sys

import torch

from contextual_bert.errors import ContextualBertError


def select_device(name: str = "auto") -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ContextualBertError("device 'cuda' was asked for (train.device or serving) but no CUDA device is available")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def evaluation_device() -> torch.device:
    """Evaluation has no device setting: it uses the best one there is."""
    return select_device("auto")


def keep_freed_memory() -> None:
    """Ask glibc to reuse freed memory instead of returning it to the OS.

    A training step allocates many tensors of a few MB; by default glibc maps each afresh, and touching new
    pages costs more than the arithmetic (over 2x the step time in a VM). Blocks above mmap's largest threshold
    (32 MB: an id table's dense gradient at 65k+ articles, allocated for every lookup of the table in a step)
    would still be mapped afresh each time, so mapping is turned off: every block comes from the heap, which
    keeps what is freed. Harmless where it does not apply.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold, m_mmap_max = -1, -3, -4
    libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)  # glibc's maximum: larger blocks are always mapped ...
    libc.mallopt(m_mmap_max, 0)  # ... unless no block may be mapped at all
    libc.mallopt(m_trim_threshold, 1 << 30)


def autocast(device: torch.device):
    """bf16 autocast on CUDA; a no-op on the CPU (fp32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
