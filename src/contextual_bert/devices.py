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
        raise ContextualBertError(
            "device 'cuda' was asked for (train.device or serving) but no CUDA device is available"
        )
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def evaluation_device() -> torch.device:
    """Evaluation has no device setting: it uses the best one there is."""
    return select_device("auto")


def keep_freed_memory(large_blocks: bool = False) -> None:
    """Ask glibc to reuse freed memory instead of returning it to the OS.

    A training step allocates many tensors of a few MB; by default glibc maps each afresh, and touching new
    pages costs more than the arithmetic (over 2x the step time in a VM). Harmless where it does not apply.

    large_blocks: keep blocks above mmap's largest threshold (32 MB) too, by mapping none (training: every step
    allocates the same large blocks, e.g. an id table's dense gradient at 65k+ articles, one per lookup of the
    table, each page-faulted afresh when mapped). Evaluation leaves them mapped: its passes allocate large blocks of
    many sizes, and a heap that keeps them fragments (docs/training.md).
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold, m_mmap_max = -1, -3, -4
    libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)  # glibc's maximum: larger blocks are mapped ...
    libc.mallopt(m_mmap_max, 0 if large_blocks else 65536)  # ... unless none may be (65536: glibc's default)
    libc.mallopt(m_trim_threshold, 1 << 30)


def autocast(device: torch.device):
    """bf16 autocast on CUDA; a no-op on the CPU (fp32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
