"""Where a training step's time goes: torch.profiler over the real step (`training.train_step`) at the paper's
sizes (`train_throughput.py`: 30k articles, batch 1,024), for one model and softmax.

Prints the operators with the most device time (CUDA) or CPU time, the kernels launched per step and, on CUDA,
how busy the GPU was: the sum of its kernels' time over the steps' wall time (low: the step waits on Python and
launches, not on arithmetic). Writes the summary as JSON (default reports/benchmarks/profile_step_<device>.json).

    python benchmarks/profile_step.py --device cuda [--variant global_state_update] [--softmax sampled]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_throughput as tt  # noqa: E402  (the paper-size batches, spec and model settings)

from contextual_bert.devices import keep_freed_memory, select_device  # noqa: E402
from contextual_bert.model import ContextualBert  # noqa: E402
from contextual_bert.training import train_step  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--variant", default="global_state_update")
    parser.add_argument("--softmax", choices=["full", "sampled"], default="sampled")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = select_device(args.device)
    torch.set_num_threads(args.threads)
    keep_freed_memory(large_blocks=True)
    batches = tt.make_batches(args.steps, warmup=5, device=device)
    torch.manual_seed(0)
    model = ContextualBert(tt.MODEL, args.variant, tt.N_ITEMS, tt.SPEC).to(device).train()
    negatives = tt.TrainConfig().negatives if args.softmax == "sampled" else None
    optimizer, scheduler, generator, sampler = tt.step_state(model, len(batches), negatives)
    for items, context in batches[:5]:
        train_step(model, optimizer, scheduler, items, context, tt.TRAIN, generator, sampler)
    tt.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for items, context in batches[5:]:
            train_step(model, optimizer, scheduler, items, context, tt.TRAIN, generator, sampler)
        tt.synchronize(device)
        wall = time.perf_counter() - started
    events = prof.key_averages()
    on_device = device.type == "cuda"
    sort_key = "self_cuda_time_total" if on_device else "self_cpu_time_total"
    print(events.table(sort_by=sort_key, row_limit=args.top, max_name_column_width=60))

    def device_us(e) -> float:
        return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)))

    rows = sorted(events, key=device_us if on_device else (lambda e: e.self_cpu_time_total), reverse=True)
    kernels = [e for e in prof.events() if on_device and e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_us = sum(device_us(e) for e in events)  # every operator's own device time: the kernels' sum
    summary = {
        "what": f"torch.profiler over {args.steps} training steps of {args.variant} ({args.softmax} softmax) at "
                "the paper's sizes (30k articles, batch 1,024)" + (", bf16 autocast" if on_device else ", fp32"),
        "device": torch.cuda.get_device_name(device) if on_device else tt.cpu_name(),
        "torch": torch.__version__,
        "ms_per_step_profiled": round(wall / args.steps * 1e3, 2),
        "kernels_per_step": round(len(kernels) / args.steps, 1) if kernels else None,
        "gpu_busy_fraction": round(kernel_us / 1e6 / wall, 3) if on_device else None,
        "top_operators": [{"name": e.key, "calls_per_step": round(e.count / args.steps, 1),
                           "self_cpu_ms_per_step": round(e.self_cpu_time_total / 1e3 / args.steps, 3),
                           "self_device_ms_per_step": round(device_us(e) / 1e3 / args.steps, 3)}
                          for e in rows[: args.top]],
    }  # fmt: skip
    out = args.out or tt.OUT_DIR / f"profile_step_{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "top_operators"}))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
