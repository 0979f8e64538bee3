"""Which CPU kernels a training or an evaluation computes with: the same on every x86 CPU with AVX2.

torch picks its kernels by the CPU it finds: ATen's vectorised loops for AVX-512 or AVX2, MKL's matrix
products and oneDNN's primitives for the widest instruction set present (AVX-512, AMX). Different kernels
round differently, so two machines of one kind but another instruction set drift apart from the first steps
and end a training a seed's noise apart (docs/reproducibility.md). `train.cpu_kernels: avx2` asks every
library for its AVX2 code path (MKL in its conditional-numerical-reproducibility mode, MKL_CBWR=AVX2,STRICT):
then two such CPUs give the same bits. `native` leaves the choice to the libraries.

The libraries read these variables once, when they start: `pin` must run before torch is imported (the CLI
calls it first). Torch-free on purpose.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PINNED = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "native": {},
}


def pin(setting: str) -> bool:
    """Set the environment for `setting` (a key of PINNED); True when torch was not yet imported, so the
    libraries will read it. The variables are set either way (a process it starts reads them)."""
    os.environ.update(PINNED[setting])
    return "torch" not in sys.modules


def cpu() -> dict[str, str]:
    """The CPU's vendor and model as Linux names them (/proc/cpuinfo; empty where there is none): the bits of a
    training hold per CPU model (docs/reproducibility.md), so claims and fixtures name it."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    return {"vendor": _first(lines, "vendor_id"), "model": _first(lines, "model name")}


def _first(lines: list[str], key: str) -> str:
    return next((line.split(":", 1)[1].strip() for line in lines if line.split(":", 1)[0].strip() == key), "")


def in_effect() -> dict:
    """What this process computes with, for metrics.json: the CPU model, ATen's capability and the libraries'
    variables."""
    import torch

    return {
        "cpu": cpu()["model"],
        "aten": torch.backends.cpu.get_cpu_capability(),
        **{name: os.environ.get(name) for name in ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA")},
    }
