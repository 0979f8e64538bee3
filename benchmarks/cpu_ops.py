"""Where two CPUs' trainings part: the bits of each operation a default training step runs, on this CPU.

Every operation is run on fixed inputs at the default training's shapes (batch 64 of outfits of 8, d_model 128,
8 heads, d_ff 256, the default catalogue of 600 articles, 1,024 sampled negatives), under `train.cpu_kernels:
avx2` as a training pins it, and its outputs (and gradients) hashed: the matrix products (mm, addmm, bmm),
the fused loss forward and backward (`LinearCrossEntropy`), the reductions (sum, mean), LayerNorm, GELU,
softmax, fused AdamW, then whole steps of [GS] (the real `train_step`). Run it on two machines and `--compare`
the files: the first operation whose bits differ is where the trainings part.

`--cost` also times the default step under MKL's other code paths (MKL_CBWR=COMPATIBLE: the SSE2 path Intel
documents as the same on Intel and non-Intel processors; AVX2,STRICT: the pinned default), each configuration
in fresh processes, round robin, and says whether their final weights' bits differ.

`--settings-against OTHER.json` runs every operation again in a fresh process under each of MKL's settings that
could steer its code path (SETTINGS: the conditional-numerical-reproducibility branches, the instruction-set cap,
the old vendor override) and lists, per setting, the operations whose bits still differ from OTHER's (the other
machine's pinned run): does any setting of this machine's MKL give the other vendor's bits?

    .venv/bin/python benchmarks/cpu_ops.py [--cost] [--out FILE] [--compare OTHER.json] [--settings-against OTHER.json]
Writes reports/benchmarks/cpu_ops_<vendor>.json (the CPU named inside).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP_SECONDS: list[float] = []  # op_hashes' time in its training steps (only), for --cost
MKL_PATHS = {"AVX2,STRICT": "the pinned default", "COMPATIBLE": "SSE2, the same on Intel and non-Intel"}
# --settings-against: MKL's variables that choose its code path, on top of the pinned ATen and oneDNN
SETTINGS = {
    "pinned": {"MKL_CBWR": "AVX2,STRICT"},
    "cbwr AVX2 (not strict)": {"MKL_CBWR": "AVX2"},
    "cbwr AVX,STRICT": {"MKL_CBWR": "AVX,STRICT"},
    "cbwr SSE4_2,STRICT": {"MKL_CBWR": "SSE4_2,STRICT"},
    "cbwr AVX512,STRICT": {"MKL_CBWR": "AVX512,STRICT"},
    "cbwr COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"},
    "MKL_ENABLE_INSTRUCTIONS=AVX2": {"MKL_CBWR": "AVX2,STRICT", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "MKL_DEBUG_CPU_TYPE=5": {"MKL_CBWR": "AVX2,STRICT", "MKL_DEBUG_CPU_TYPE": "5"},
}


def digest(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def op_hashes(steps: int) -> dict[str, str]:
    import torch
    import torch.nn.functional as F

    from contextual_bert.config import ModelConfig, TrainConfig
    from contextual_bert.data import N_SPECIAL, ContextSpec
    from contextual_bert.model import build_model
    from contextual_bert.training import LinearCrossEntropy, NegativeSampler, make_optimizer, train_step

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)

    def rand(*shape, grad=False):
        return torch.randn(*shape, generator=g).requires_grad_(grad)

    out = {}
    x, w, b = rand(512, 128), rand(384, 128), rand(384)
    out["mm 512x128 @ 128x384"] = digest(x @ w.T)
    out["addmm (linear with bias)"] = digest(F.linear(x, w, b))
    q, k = rand(512, 8, 16), rand(512, 16, 8)
    out["bmm (attention scores)"] = digest(torch.bmm(q, k))
    h, ow, ob = rand(170, 128, grad=True), rand(600 + N_SPECIAL, 128, grad=True), rand(600 + N_SPECIAL, grad=True)
    targets = torch.randint(0, 600, (170,), generator=g)
    loss = LinearCrossEntropy.apply(h, ow, ob, targets, N_SPECIAL, 4096)
    out["fused loss forward"] = digest(loss)
    loss.backward()
    out["fused loss backward d/dh"], out["fused loss backward d/dW"] = digest(h.grad), digest(ow.grad)
    out["fused loss backward d/db"] = digest(ob.grad)
    z = rand(170, 600)
    out["sum over rows"], out["mean"] = digest(z.sum(0)), digest(z.mean())
    y = rand(512, 128, grad=True)
    ln = F.layer_norm(y, (128,))
    ln.sum().backward()
    out["layer_norm forward"], out["layer_norm backward"] = digest(ln), digest(y.grad)
    y.grad = None
    ge = F.gelu(y)
    (ge * ge).sum().backward()
    out["gelu forward"], out["gelu backward"] = digest(ge), digest(y.grad)
    out["softmax"], out["log_softmax"] = digest(torch.softmax(z, 1)), digest(torch.log_softmax(z, 1))
    p = rand(600, 128, grad=True)
    p.grad = rand(600, 128)
    opt = torch.optim.AdamW([p], lr=0.002, weight_decay=0.3, fused=True)
    opt.step()
    out["fused AdamW step"] = digest(p)

    # whole steps of the real training step on one fixed batch
    cfg, model_cfg = TrainConfig(), ModelConfig()
    from contextual_bert.data import FeatureSpec

    spec = ContextSpec((FeatureSpec("age", "categorical", "customer", N_SPECIAL + 10, 32),))
    torch.manual_seed(0)
    model = build_model(model_cfg, "global_state", 600 + N_SPECIAL, spec)
    model.train()
    items = torch.randint(N_SPECIAL, 600 + N_SPECIAL, (64, 8), generator=g)
    context = {"age": torch.randint(N_SPECIAL, N_SPECIAL + 10, (64,), generator=g)}
    optimizer = make_optimizer(model, cfg, torch.device("cpu"))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    sampler = NegativeSampler(torch.ones(600 + N_SPECIAL), 600, torch.Generator().manual_seed(1))
    step_g = torch.Generator().manual_seed(2)
    seconds = 0.0
    for step in range(1, steps + 1):
        started = time.perf_counter()
        train_step(model, optimizer, scheduler, items, context, cfg, step_g, sampler)
        seconds += time.perf_counter() - started
        if step in (1, steps):
            out[f"[GS] weights after {step} training step(s)"] = digest(*model.state_dict().values())
    STEP_SECONDS.append(seconds)
    return out


def step_seconds(mkl_path: str, steps: int) -> dict:
    """One fresh process: the training steps under MKL_CBWR=mkl_path; their seconds and the weights' bits."""
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import cpu_ops; "
        f"h = cpu_ops.op_hashes({steps}); "
        f"print(cpu_ops.STEP_SECONDS[-1], h['[GS] weights after {steps} training step(s)'])"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": mkl_path}
    seconds, bits = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return {"seconds": float(seconds), "bits": bits}


def hashes_under(settings: dict[str, str], steps: int) -> dict[str, str]:
    """op_hashes in a fresh process (the libraries read their variables once) under the pinned ATen and oneDNN and
    these MKL `settings`."""
    code = (
        f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); import cpu_ops; "
        f"print(json.dumps(cpu_ops.op_hashes({steps})))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MKL_")}
    env |= {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", **settings}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cost", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", type=Path, help="another machine's file: the operations whose bits differ")
    parser.add_argument("--settings-against", type=Path, help="another machine's file: MKL's settings tried (SETTINGS)")
    args = parser.parse_args()

    from contextual_bert import cpu_kernels

    cpu_kernels.pin("avx2")
    report = {
        "benchmark": "cpu_ops",
        "cpu": cpu_kernels.cpu(),
        "cores": os.cpu_count(),
        "load_average_before": os.getloadavg(),
    }
    report["commit"] = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    import torch

    report |= {"torch": torch.__version__, "kernels": cpu_kernels.in_effect(), "ops": op_hashes(args.steps)}
    if args.cost:
        runs = {path: [] for path in MKL_PATHS}
        for _ in range(args.repeats):  # round robin: the machine's load spreads over both alike
            for path in MKL_PATHS:
                runs[path].append(step_seconds(path, args.steps))
        base = statistics.median(r["seconds"] for r in runs["AVX2,STRICT"])
        report["mkl_paths"] = {
            path: {
                "why": MKL_PATHS[path],
                "median_s": round(statistics.median(r["seconds"] for r in rs), 3),
                "vs_pinned": round(statistics.median(r["seconds"] for r in rs) / base, 2),
                "bits": sorted({r["bits"] for r in rs}),
            }
            for path, rs in runs.items()
        }
    report["load_average_after"] = os.getloadavg()
    if args.compare:
        other = json.loads(args.compare.read_text())
        report["compared_with"] = {
            "cpu": other["cpu"],
            "differ": [name for name, bits in report["ops"].items() if other["ops"].get(name) != bits],
        }
    if args.settings_against:
        other = json.loads(args.settings_against.read_text())
        tried = {}
        for name, settings in SETTINGS.items():
            ops = hashes_under(settings, args.steps)
            tried[name] = {
                "settings": settings,
                "differ": [k for k, bits in ops.items() if other["ops"].get(k) != bits],
            }
        report["settings_against"] = {"cpu": other["cpu"], "commit": other.get("commit"), "settings": tried}
    vendor = report["cpu"]["vendor"].lower() or "unknown"
    out = args.out or ROOT / "reports" / "benchmarks" / f"cpu_ops_{vendor}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
