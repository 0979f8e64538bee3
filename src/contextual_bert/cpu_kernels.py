"""Which CPU kernels a training or an evaluation computes with: chosen per CPU model, the same bits on one model.

torch picks its kernels by the CPU it finds: ATen's vectorised loops for AVX-512 or AVX2, MKL's matrix
products and oneDNN's primitives for the widest instruction set present (AVX-512, AMX). Different kernels
round differently, so two machines of one kind but another instruction set drift apart from the first steps
and end a training a seed's noise apart (docs/reproducibility.md). `train.cpu_kernels: avx2` asks every
library for its AVX2 code path (MKL in its conditional-numerical-reproducibility mode, MKL_CBWR=AVX2,STRICT):
then two such CPUs give the same bits. `native` leaves the choice to the libraries. `auto` (the default) takes
the one measured fastest on this CPU model (FASTEST), and `avx2` on a CPU no measurement names: a lookup of
/proc/cpuinfo, never a timing, so a machine's choice and its bits are the same from run to run.

The libraries read these variables once, when they start: `pin` must run before torch is imported (the CLI
calls it first). Torch-free on purpose.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

PINNED = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "native": {},
}
SETTINGS = ("auto", *PINNED)  # train.cpu_kernels's values (config.py)
VARIABLES = sorted({name for env in PINNED.values() for name in env})
SAFE = "avx2"  # for a CPU no measurement names: the setting under which every x86 CPU with AVX2 of a vendor agrees
CPUINFO = Path("/proc/cpuinfo")

# auto's table: the setting measured fastest on a CPU model, and the benchmark file behind it
# (benchmarks/cpu_kernels_choice.py: train_throughput.py --softmax sampled --no-reference, [GSU] and [None], 1 and 2
# threads, native against pinned). `native` only where it was faster by MARGIN in every row measured: choosing it
# changes that CPU's bits, and a rate moves by up to 10% run to run on the 2-core machine. An entry names a CPU
# by /proc/cpuinfo's fields; it matches when each field it gives is equal (flags: each present). The first wins.
MARGIN = 1.10
FASTEST: tuple[dict[str, Any], ...] = (
    {
        # Measured at 65c9af0 (issue 91): native 1.32-1.55x the pinned rate, `make repro` 20:21 against 29:05.
        # Its family and model numbers were not recorded then: matched by name and AVX-512.
        "cpu": {"vendor": "GenuineIntel", "model": "Intel(R) Xeon(R) Processor", "flags": ("avx512f",)},
        "kernels": "native",
        "measured": "reports/benchmarks/cpu_kernels_genuineintel.json",
    },
    {
        # Zen 4. Measured at 81c676a, loaded: native = pinned within 1% per CPU second at 1 thread, no gain
        # to change the bits of the committed Table 1 for
        "cpu": {
            "vendor": "AuthenticAMD",
            "family": "25",
            "model_number": "17",
            "model": "AMD EPYC",
            "flags": ("avx512f",),
        },
        "kernels": "avx2",
        "measured": "reports/benchmarks/cpu_kernels_authenticamd.json",
    },
)


def parse_cpuinfo(text: str) -> dict:
    """The first processor's vendor, family and model numbers, model name and flags (empty where absent)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block: every core of one machine is the same model
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return {
        "vendor": fields.get("vendor_id", ""),
        "family": fields.get("cpu family", ""),
        "model_number": fields.get("model", ""),
        "model": fields.get("model name", ""),
        "flags": frozenset(fields.get("flags", "").split()),
    }


def _read_cpuinfo() -> dict:
    try:
        return parse_cpuinfo(CPUINFO.read_text())
    except OSError:
        return parse_cpuinfo("")


def cpu() -> dict[str, str]:
    """The CPU's vendor, model name, family and model number as Linux names them (/proc/cpuinfo; empty where
    there is none): the bits of a training hold per CPU model (docs/reproducibility.md), so claims and fixtures
    name it."""
    return {k: v for k, v in _read_cpuinfo().items() if k != "flags"}


def choose(info: dict) -> tuple[str, str | None]:
    """What `auto` takes on the CPU `info` (parse_cpuinfo) describes: the setting and the benchmark file it rests
    on, or (SAFE, None) where no entry of FASTEST matches."""
    for entry in FASTEST:
        want = entry["cpu"]
        if all(info[k] == v for k, v in want.items() if k != "flags") and set(want.get("flags", ())) <= info["flags"]:
            return entry["kernels"], entry["measured"]
    return SAFE, None


def resolve(setting: str) -> str:
    """`setting` as a key of PINNED: `auto` looked up for this machine's CPU."""
    if setting not in SETTINGS:
        raise ValueError(f"train.cpu_kernels: {setting!r} is none of {', '.join(SETTINGS)}")
    return choose(_read_cpuinfo())[0] if setting == "auto" else setting


def pin(setting: str) -> bool:
    """Set the environment for `setting` (one of SETTINGS): its variables, and none of another setting's (an
    inherited pin would otherwise outlive `native`). True when torch was not yet imported, so the libraries will
    read it; the variables are set either way (a process it starts reads them)."""
    for name in VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(PINNED[resolve(setting)])
    return "torch" not in sys.modules


def pin_or_restart(setting: str) -> None:
    """`pin`, for a script that has imported torch: where that changed the environment, the process starts again
    under it (the libraries read it once), with the same arguments."""
    before = {name: os.environ.get(name) for name in VARIABLES}
    if not pin(setting) and before != {name: os.environ.get(name) for name in VARIABLES}:
        os.execv(sys.executable, [sys.executable, *sys.argv])


def pinned_setting() -> str:
    """The key of PINNED this process's environment matches, or "other" (variables set by hand)."""
    now = {name: os.environ[name] for name in VARIABLES if name in os.environ}
    return next((key for key, env in PINNED.items() if env == now), "other")


def in_effect() -> dict:
    """What this process computes with, for metrics.json: the CPU model, the setting in effect and what `auto`
    takes here (with the benchmark it rests on; null: no measurement names this CPU), ATen's capability and the
    libraries' variables."""
    import torch

    info = _read_cpuinfo()
    auto, measured = choose(info)
    return {
        "cpu": info["model"],
        "cpu_family_model": f"{info['vendor']} {info['family']}/{info['model_number']}",
        "kernels": pinned_setting(),
        "auto": auto,
        "auto_measured": measured,
        "aten": torch.backends.cpu.get_cpu_capability(),
        **{name: os.environ.get(name) for name in ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA")},
    }
