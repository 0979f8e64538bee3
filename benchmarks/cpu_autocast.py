"""fp32 against bf16 autocast for the CPU training step: [GSU] (or --variant) at the paper's sizes, sampled
softmax, the two models stepped in turns on the same batches, so that the machine's drift and load reach both
alike. Writes reports/benchmarks/cpu_bf16_autocast.json. The pipeline trains in fp32 on the CPU
(`devices.autocast`); this says what bf16 would buy there.

    .venv/bin/python benchmarks/cpu_autocast.py [--variant global_state_update] [--steps 16] [--threads 2]
        [--cpu-kernels native]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_throughput as tt  # noqa: E402  (the paper-size batches, spec and model settings)

import contextual_bert.training as training  # noqa: E402
from contextual_bert import cpu_kernels  # noqa: E402
from contextual_bert.devices import keep_freed_memory  # noqa: E402
from contextual_bert.model import ContextualBert  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "reports" / "benchmarks" / "cpu_bf16_autocast.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="global_state_update")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--note", default="")
    parser.add_argument(
        "--cpu-kernels", choices=cpu_kernels.SETTINGS, default="native", help="as train.cpu_kernels (avx2: no AMX)"
    )
    args = parser.parse_args()
    cpu_kernels.pin_or_restart(args.cpu_kernels)
    torch.set_num_threads(args.threads)
    keep_freed_memory(large_blocks=True)
    batches = tt.make_batches(args.steps, warmup=args.warmup, device=torch.device("cpu"))

    def bf16_loss(*a, **kw):
        # inside train_step's own autocast (devices.autocast, off on the CPU): the forward pass and its loss
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return training.masked_item_loss(*a, **kw)

    # fp32: the pipeline's own step; bf16: the same step, its loss swapped through the step's seam (step_loss)
    modes = {"fp32": contextlib.nullcontext, "bf16": lambda: training.step_loss(bf16_loss)}
    states = {}
    for name in modes:
        torch.manual_seed(0)
        model = ContextualBert(tt.MODEL, args.variant, tt.N_ITEMS, tt.SPEC).train()
        states[name] = (model, *tt.step_state(model, len(batches), tt.TrainConfig().negatives))
    seconds, samples, load_before = dict.fromkeys(modes, 0.0), dict.fromkeys(modes, 0), os.getloadavg()
    for i, (items, context) in enumerate(batches):
        for name, (model, optimizer, scheduler, generator, sampler) in states.items():
            with modes[name]():
                started = time.perf_counter()
                training.train_step(model, optimizer, scheduler, items, context, tt.TRAIN, generator, sampler)
                if i >= args.warmup:
                    seconds[name] += time.perf_counter() - started
                    samples[name] += items.shape[0]
    result = {
        "what": f"{args.variant} training step at the paper's sizes, sampled softmax, fp32 against bf16 "
        f"autocast, stepped in turns on the same {args.steps} batches",
        "note": args.note,
        "threads": args.threads,
        "torch": torch.__version__,
        # bf16's gain depends on the CPU (AMX on an Intel Xeon) and on the kernels allowed (avx2 shuts AMX out)
        "commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=OUT.parents[2], capture_output=True, text=True
        ).stdout.strip(),
        "cpu": cpu_kernels.cpu(),
        "kernels": cpu_kernels.in_effect(),
        "load_average": [load_before, os.getloadavg()],
        "train_samples_per_s": {name: round(samples[name] / seconds[name], 1) for name in modes},
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
