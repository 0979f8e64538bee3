"""Training and inference throughput (samples/s) of every variant at the paper's sizes.

Paper sizes: 30,000 articles, d_model 128, 4 blocks, 8 heads, d_ff 256, d_context 736 (the paper's thirteen
features), batches of 1,024 outfits of 4-8 articles. Training runs the real step (`training.train_step`:
masking, forward, loss, backward, AdamW); inference is `masked_logits` on outfits with one [MASK].

In the same run, a reference of the same size built the common way: `torch.nn.TransformerEncoder` (which
has the fused fast path for inference), an untied `nn.Linear` output layer and logits at every position,
the loss then taken at the masked positions. Writes reports/benchmarks/throughput.json with the torch
version, the threads and the load average around the run: other work on the machine slows every number.

    .venv/bin/python benchmarks/train_throughput.py [--threads 2] [--steps 8] [--variants ...] [--note "..."]

`--softmax full sampled` times both training losses (sampled: `--negatives` popularity draws shared by the batch,
training.NegativeSampler over Zipf(1) sightings; rows under "variants" are the full softmax's, under
"variants_sampled" the sampled one's).

Batches are formed as training forms them (`make_batches`; `--padded`: padded to 8, as this benchmark timed them
before); `--repeats N` times each variant N times and reports every run's rate and their mean (run to run, a
rate moves by up to 10% on the 2-core machine).

`--compile none static dynamic` also times each row with the encoder's blocks (and the state's updates) under
torch.compile, static or dynamic shapes, the modes in turn on the same batches; a compiled row first takes one
untimed step per batch width (its `compile_seconds`) and goes under "variants[_sampled]_compile_<mode>".

`--cpu-kernels` (default native, as the libraries choose) sets `train.cpu_kernels`'s variables
(`cpu_kernels.pin_or_restart`: the libraries read them once, at start, so the script restarts itself under them
where they differ from its environment). The JSON records the setting in effect, the CPU model and the commit.

`--device cuda` runs the same steps on the GPU as the pipeline runs them there (training under bf16 autocast,
`devices.autocast`; inference as serving does, also under it) and writes reports/benchmarks/throughput_cuda.json;
each timed call ends with a CUDA synchronize, so the time is the kernels', not their launch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from contextual_bert import cpu_kernels
from contextual_bert.config import VARIANTS, ModelConfig, TrainConfig
from contextual_bert.data import MASK_INDEX, N_SPECIAL, PAD_INDEX, ContextSpec, FeatureSpec
from contextual_bert.devices import autocast, keep_freed_memory, select_device
from contextual_bert.model import PAPER_SIZES, ContextualBert, count_paper_parameters
from contextual_bert.training import (
    BUCKET_BATCHES,
    NegativeSampler,
    length_batches,
    lr_factor,
    make_optimizer,
    mask_items,
    train_step,
)

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = REPO / "reports" / "benchmarks"
N_ARTICLES, BATCH, MAX_SET = 30_000, 1024, 8
N_ITEMS = N_SPECIAL + N_ARTICLES

# The paper's features (dims sum to 736) with plausible cardinalities; multi-valued ones hold up to 8 values.
PAPER_FEATURES = [
    ("age", "numeric", 13, 32), ("gender", "categorical", 5, 16), ("country", "categorical", 25, 32),
    ("preferred_brands", "multi_categorical", 400, 160), ("preferred_colors", "multi_categorical", 25, 64),
    ("preferred_styles", "multi_categorical", 60, 160), ("nogo_product_types", "multi_categorical", 40, 64),
    ("size_top", "categorical", 12, 32), ("size_bottom", "categorical", 20, 32), ("size_shoes", "categorical", 20, 32),
    ("price_min", "numeric", 13, 32), ("price_max", "numeric", 13, 32), ("occasion", "categorical", 10, 48),
]  # fmt: skip
SPEC = ContextSpec(
    tuple(
        FeatureSpec(name, kind, "customer", card, dim, max_values=8 if kind == "multi_categorical" else 1)
        for name, kind, card, dim in PAPER_FEATURES
    )  # fmt: skip
)
MODEL = ModelConfig(d_model=128, n_blocks=4, n_heads=8, d_ff=256, dropout=0.1, max_set_size=MAX_SET)
TRAIN = TrainConfig(batch_size=BATCH, learning_rate=1e-3, lr_warmup_steps=200, device="cpu")


def popularity_counts(n_items: int) -> torch.Tensor:
    """Zipf(1) sightings: the sampler's popularity (the batches' articles are uniform)."""
    counts = torch.zeros(n_items, dtype=torch.long)
    counts[N_SPECIAL:] = (1e6 / torch.arange(1, n_items - N_SPECIAL + 1)).long() + 1
    return counts


def make_batches(
    n: int,
    seed: int = 0,
    n_items: int = N_ITEMS,
    device: torch.device | str = "cpu",
    warmup: int = 0,
    padded: bool = False,
) -> list[tuple[torch.Tensor, dict]]:
    """`warmup` batches, then `n` more, of outfits of 4-8 random articles (of n_items) with random customer
    contexts, batched as training batches them (`training.length_batches`: outfits of similar length together,
    each batch trimmed to its longest). Each group is picked from one window of training's batches, spread
    evenly over their widths, so that a few timed batches have training's mean width (a random handful would
    not). `padded`: the same outfits padded to 8 (what this benchmark timed before). Drawn on the CPU, so
    every device times the same batches."""
    draw = _padded_batches if padded else _length_batches
    return draw(warmup, seed + 1, n_items, device) + draw(n, seed, n_items, device)


def _padded_batches(n: int, seed: int, n_items: int, device) -> list[tuple[torch.Tensor, dict]]:
    batches = _length_batches(n, seed, n_items, device)
    return [(F.pad(items, (0, MAX_SET - items.shape[1]), value=PAD_INDEX), context) for items, context in batches]


def _length_batches(n: int, seed: int, n_items: int, device) -> list[tuple[torch.Tensor, dict]]:
    if n == 0:
        return []
    g = torch.Generator().manual_seed(seed)
    size = max(n, BUCKET_BATCHES) * BATCH  # at least one window of length_batches
    items = torch.randint(N_SPECIAL, n_items, (size, MAX_SET), generator=g)
    lengths = torch.randint(4, MAX_SET + 1, (size,), generator=g)
    items[torch.arange(MAX_SET) >= lengths[:, None]] = PAD_INDEX
    context = {}
    for f in SPEC.features:
        shape = (size, f.max_values) if f.kind == "multi_categorical" else (size,)
        context[f.name] = torch.randint(0 if f.kind == "multi_categorical" else 1, f.cardinality, shape, generator=g)
    batches = length_batches(torch.randperm(size, generator=g), lengths, BATCH, g)
    by_width = sorted(batches, key=lambda index: int(lengths[index].max()))
    picked = [by_width[(2 * i + 1) * len(by_width) // (2 * n)] for i in torch.randperm(n, generator=g).tolist()]
    return [
        (
            items[index, : int(lengths[index].max())].to(device),
            {name: values[index].to(device) for name, values in context.items()},
        )
        for index in picked
    ]


def mean_width(batches) -> float:
    """The timed batches' mean padded length (training's: the mean outfit length, ~6 here)."""
    return round(sum(items.shape[1] for items, _ in batches) / len(batches), 2)


def step_state(model, n_steps: int, negatives: int | None = None, n_items: int = N_ITEMS):
    """What `training.train_step` needs beside the model (on its device): (optimizer, scheduler, generator,
    sampler); sampler None for the full softmax, else `negatives` draws per step from popularity_counts."""
    device = next(model.parameters()).device
    optimizer = make_optimizer(model, TRAIN, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(TRAIN, n_steps))
    generator = torch.Generator(device=device).manual_seed(0)
    sampler = None if negatives is None else NegativeSampler(popularity_counts(n_items), negatives, generator)
    return optimizer, scheduler, generator, sampler


def peak_memory(device: torch.device) -> dict:
    """This process's peak resident memory, and on a GPU the peak of its tensors there."""
    out = {"peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if device.type == "cuda":
        out["peak_gpu_memory_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return out


def with_one_mask(items: torch.Tensor) -> torch.Tensor:
    """Each outfit with its first article replaced by [MASK] (what serving sends)."""
    masked = items.clone()
    masked[:, 0] = MASK_INDEX
    return masked


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":  # kernels run asynchronously: wait for them before reading the clock
        torch.cuda.synchronize(device)


def timed(fn, batches, warmup: int) -> list[float]:
    """Seconds of each call of fn over the batches, after `warmup` calls."""
    device = batches[0][0].device
    for items, context in batches[:warmup]:
        fn(items, context)
    seconds = []
    for items, context in batches[warmup:]:
        synchronize(device)
        started = time.perf_counter()
        fn(items, context)
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    return seconds


def rates(prefix: str, seconds: list[float]) -> dict:
    """samples/s from the mean time per batch (the headline), and the median and fastest batch."""
    mean = sum(seconds) / len(seconds)
    return {
        f"{prefix}_samples_per_s": round(BATCH / mean, 1),
        f"{prefix}_batch_ms": {
            "mean": round(mean * 1e3, 1),
            "median": round(statistics.median(seconds) * 1e3, 1),
            "min": round(min(seconds) * 1e3, 1),
        },  # fmt: skip
    }


def compile_blocks(model: ContextualBert, mode: str) -> None:
    """torch.compile (inductor) the encoder's blocks and [GSU]'s and [GS2]'s state updates (and [GS2]'s reads) in
    place, shapes `mode` ("static": one graph per batch width; "dynamic")."""
    for module in [*model.blocks, *(model.global_state_reads or []), *(model.global_state_updates or [])]:
        module.compile(dynamic=mode == "dynamic")


def one_per_width(batches) -> list:
    """A batch of every width among `batches`: the steps that compile a static graph for each."""
    return list({items.shape[1]: (items, context) for items, context in batches}.values())


def bench_variant(variant: str, batches, warmup: int, negatives: int | None = None, compile_mode: str = "none") -> dict:
    """negatives: None for the full softmax, else the sampled one's popularity draws per step. compile_mode
    other than "none": compile_blocks first, then one untimed step per width (its seconds are reported)."""
    device = batches[0][0].device
    torch.manual_seed(0)
    model = ContextualBert(MODEL, variant, N_ITEMS, SPEC).to(device)
    optimizer, scheduler, generator, sampler = step_state(model, len(batches), negatives)
    masked_per_batch, cpu_s = [], []

    def step(items, context):
        started = time.process_time()
        _, predict = train_step(model, optimizer, scheduler, items, context, TRAIN, generator, sampler)
        cpu_s.append(time.process_time() - started)
        masked_per_batch.append(int(predict.sum()))

    model.train()
    compiled = {}
    if compile_mode != "none":
        compile_blocks(model, compile_mode)
        started = time.perf_counter()
        for items, context in one_per_width(batches):
            step(items, context)
        compiled = {"compile": compile_mode, "compile_seconds": round(time.perf_counter() - started, 1)}
        masked_per_batch.clear()
        cpu_s.clear()
    train_s = timed(step, batches, warmup)
    cpu_s = cpu_s[warmup:]
    model.eval()

    def infer(items, context):
        with torch.no_grad(), autocast(device):
            model.masked_logits(with_one_mask(items), context)

    infer_s = timed(infer, batches, warmup)
    return {
        "parameters": count_paper_parameters(model),
        **rates("train", train_s),
        # the process's CPU seconds per step: at one thread the step's own, which other work slows less than
        # the wall clock (at two, it counts the threads' waits for each other too)
        "train_cpu_samples_per_s": round(BATCH * len(cpu_s) / sum(cpu_s), 1),
        **rates("inference", infer_s),
        "masked_positions_per_batch": round(sum(masked_per_batch) / len(masked_per_batch), 1),
        **compiled,
    }


def repeated(
    variant: str, batches, warmup: int, repeats: int, negatives: int | None = None, compile_mode: str = "none"
) -> dict:
    """bench_variant `repeats` times; the first run's row, with every run's training rate and their mean."""
    runs = [bench_variant(variant, batches, warmup, negatives, compile_mode) for _ in range(repeats)]
    if repeats == 1:
        return runs[0]
    rates_ = [run["train_samples_per_s"] for run in runs]
    return {**runs[0], "train_samples_per_s": round(sum(rates_) / repeats, 1), "train_samples_per_s_runs": rates_}


class ReferenceEncoder(nn.Module):
    """The common implementation: nn.TransformerEncoder, output layer applied at every position."""

    def __init__(self, n_items: int = N_ITEMS):
        super().__init__()
        self.n_items = n_items
        self.embeddings = nn.Embedding(n_items, MODEL.d_model, padding_idx=PAD_INDEX)
        layer = nn.TransformerEncoderLayer(MODEL.d_model, MODEL.n_heads, MODEL.d_ff, MODEL.dropout,
                                           activation="gelu", batch_first=True)  # fmt: skip
        self.encoder = nn.TransformerEncoder(layer, MODEL.n_blocks)  # nested tensors skip padding at inference
        self.head = nn.Sequential(nn.Linear(MODEL.d_model, MODEL.d_model), nn.GELU())
        self.output = nn.Linear(MODEL.d_model, n_items)

    def forward(self, items):  # (B, L) -> (B, L, n_items)
        hidden = self.encoder(self.embeddings(items), src_key_padding_mask=items == PAD_INDEX)
        return self.output(self.head(hidden))


def bench_reference(batches, warmup: int, n_items: int = N_ITEMS) -> dict:
    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype")
    device = batches[0][0].device
    torch.manual_seed(0)
    model = ReferenceEncoder(n_items).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator(device=device).manual_seed(0)

    def step(items, context):
        inputs, predict = mask_items(items, model.n_items, TRAIN, generator)
        labels = items.masked_fill(~predict, -100)
        with autocast(device):
            logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    model.train()
    train_s = timed(step, batches, warmup)
    model.eval()

    def infer(items, context):
        with torch.no_grad(), autocast(device):
            masked = with_one_mask(items)
            model(masked)[masked == MASK_INDEX]

    infer_s = timed(infer, batches, warmup)
    return {
        "what": "nn.TransformerEncoder (same sizes, GELU, post-norm), untied nn.Linear output at every position",
        "parameters_total": sum(p.numel() for p in model.parameters()),
        **rates("train", train_s),
        **rates("inference", infer_s),
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="timed batches per variant (after warm-up)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reference-steps", type=int, default=3)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--note", default="", help="e.g. whether other work shared the machine")
    parser.add_argument("--softmax", nargs="+", choices=["full", "sampled"], default=["full"])
    parser.add_argument("--negatives", type=int, default=TrainConfig().negatives)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (as train.device)")
    parser.add_argument("--out", type=Path, help="default: reports/benchmarks/throughput[_cuda].json")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="time each variant this many times (fresh models); "
        "the rows then give every run's train_samples_per_s and their mean",
    )
    parser.add_argument(
        "--cpu-kernels", choices=cpu_kernels.SETTINGS, default="native", help="as train.cpu_kernels (cpu_kernels.py)"
    )
    parser.add_argument("--padded", action="store_true", help="batches padded to 8 (not as training forms them)")
    parser.add_argument(
        "--compile",
        nargs="+",
        choices=["none", "static", "dynamic"],
        default=["none"],
        help="time each row under these torch.compile modes (compile_blocks); rows other than "
        "none go under variants[_sampled]_compile_<mode>",
    )
    args = parser.parse_args()
    cpu_kernels.pin_or_restart(args.cpu_kernels)

    device = select_device(args.device)
    out = args.out or OUT_DIR / ("throughput.json" if device.type == "cpu" else f"throughput_{device.type}.json")
    torch.set_num_threads(args.threads)
    keep_freed_memory(large_blocks=True)  # as training does
    load_before = os.getloadavg()
    started = time.perf_counter()
    batches = make_batches(args.steps, warmup=args.warmup, device=device, padded=args.padded)
    rows = {}  # "variants", "variants_sampled", and with --compile "variants[_sampled]_compile_<mode>"
    for variant in args.variants:
        for softmax in args.softmax:
            for mode in args.compile:  # the modes in turn, so that each is timed in the same period
                key = (
                    "variants"
                    + ("_sampled" if softmax == "sampled" else "")
                    + (f"_compile_{mode}" if mode != "none" else "")
                )
                negatives = args.negatives if softmax == "sampled" else None
                row = repeated(variant, batches, args.warmup, args.repeats, negatives, mode)
                rows.setdefault(key, {})[variant] = row
                print(variant, softmax, mode, json.dumps(row), flush=True)
    results, sampled = rows.pop("variants", {}), rows.pop("variants_sampled", {})
    reference = None
    if not args.no_reference:
        reference = bench_reference(batches[max(args.warmup - 1, 0) : args.warmup + args.reference_steps], warmup=1)
        print("reference", json.dumps(reference), flush=True)

    report = {
        "what": "training and inference samples/s at the paper's sizes, "
        + ("CPU, fp32" if device.type == "cpu" else f"{device.type}, bf16 autocast (as training and serving)"),
        "settings": {
            "n_articles": N_ARTICLES,
            "batch_size": BATCH,
            "outfit_sizes": "uniform 4..8, " + ("padded to 8" if args.padded else "batched as training does"),
            "mean_width": mean_width(batches[args.warmup :]),
            **PAPER_SIZES,
            "dropout": MODEL.dropout,
            "mask_prob": TRAIN.mask_prob,
            "grad_clip": TRAIN.grad_clip,
            "timed_batches": args.steps,
            "warmup_batches": args.warmup,
            "reference_timed_batches": args.reference_steps,
            "repeats": args.repeats,
            "softmax": args.softmax,
            "negatives": args.negatives if "sampled" in args.softmax else None,
            "compile": args.compile,
        },  # fmt: skip
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip(),
        "uncommitted_changes": bool(
            subprocess.run(
                ["git", "status", "--porcelain", "src", "benchmarks"], cwd=REPO, capture_output=True, text=True
            ).stdout.strip()
        ),
        "machine": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu": cpu_name(),
            "cpu_id": cpu_kernels.cpu(),
            "cpu_kernels": {"setting": args.cpu_kernels, **cpu_kernels.in_effect()} if device.type == "cpu" else None,
            "cpu_count": os.cpu_count(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "peak_gpu_memory_mib": peak_memory(device).get("peak_gpu_memory_mib"),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "note": args.note,
        "variants": results,
        **({"variants_sampled": sampled} if sampled else {}),
        **rows,
        "reference": reference,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if reference:
        report["speedup_vs_reference"] = {
            v: {"train": round(r["train_samples_per_s"] / reference["train_samples_per_s"], 1),
                "inference": round(r["inference_samples_per_s"] / reference["inference_samples_per_s"], 1)}
            for v, r in (results or sampled).items()
        }  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
