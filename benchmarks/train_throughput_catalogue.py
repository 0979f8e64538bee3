"""Training samples/s at catalogue scale, full against sampled softmax (issue 44), with peak memory, the step's
FLOPs and the projected time of one training on H&M's full data.

For every catalogue size (default 3k, 30k, 105k articles), every model (the five variants and two `_attrs`
twins) and softmax (full | sampled, train.negatives draws), the real training step (`training.train_step`:
masking, forward, loss, backward, clipping, AdamW) at the paper's sizes (batch 1,024, d_model 128, 4 blocks,
d_context 736; `train_throughput.py`), each configuration in a process of its own so that its peak resident
memory (ru_maxrss) is its own. Beside them, per size: "encoder only", [GSU]'s step with the output layer
replaced by a free linear read-out of the head states (what the encoder alone allows), and the
nn.TransformerEncoder reference with its untied full output layer at every position.

The `_attrs` twins read six categorical attributes (H&M's: product type 130 values, colour 50, appearance
30, section 60, index group 10, garment group 25) with id dropout 0.5 and the outfit offsets on, every
article of the catalogue with an id. FLOPs: torch.utils.flop_counter on one step (matrix products, forward
and backward; elementwise work is not counted). Writes reports/benchmarks/throughput_catalogue.json.

    .venv/bin/python benchmarks/train_throughput_catalogue.py [--threads 2] [--articles 3000 30000 105000]
        [--models ...] [--softmax full sampled] [--negatives 1024] [--steps 3] [--note "..."]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_throughput as tt  # noqa: E402  (the paper-size batches, spec, model and reference)

from contextual_bert.config import VARIANTS  # noqa: E402
from contextual_bert.data import N_SPECIAL, ContextSpec, FeatureSpec  # noqa: E402
from contextual_bert.devices import keep_freed_memory, select_device  # noqa: E402
from contextual_bert.model import build_model, count_paper_parameters  # noqa: E402
from contextual_bert.training import mask_items, train_step  # noqa: E402

OUT = tt.OUT_DIR / "throughput_catalogue.json"
ATTRIBUTES = [("product_type", 130), ("colour", 50), ("appearance", 30), ("section", 60), ("index_group", 10),
              ("garment_group", 25)]  # fmt: skip
ATTRIBUTE_SPEC = ContextSpec(tuple(FeatureSpec(name, "categorical", "article", N_SPECIAL + card, 16)
                                   for name, card in ATTRIBUTES))  # fmt: skip
ATTRS_MODELS = ["none_attrs", "global_state_attrs"]
HM_OUTFITS, EPOCHS = 2_700_000, 32  # H&M's full data (hm_full_size.py) and the default recipe's epochs
H100_BF16_DENSE = 989e12  # FLOP/s, SXM, dense bf16 (NVIDIA's datasheet)


def build(model_name: str, n_items: int):
    torch.manual_seed(0)
    attributes = ATTRIBUTE_SPEC if model_name.endswith("_attrs") else None
    model = build_model(tt.MODEL, model_name, n_items, tt.SPEC, attributes)  # with the overlap (ModelConfig default)
    if attributes is not None:
        g = torch.Generator().manual_seed(1)
        model.set_catalogue({f.name: torch.randint(N_SPECIAL, f.cardinality, (n_items,), generator=g)
                             for f in attributes.features})  # fmt: skip
        model.set_id_dropout(0.5)
    return model


def encoder_only_step(model, optimizer, items, context, generator, probe):
    """train_step with the output layer replaced by a free read-out: the encoder's (and head's) own cost."""
    inputs, predict = mask_items(items, model.n_items, tt.TRAIN, generator)
    head = model.head(model(inputs, context, select=predict))
    loss = (head * probe).sum() / len(head)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), tt.TRAIN.grad_clip, foreach=True)
    optimizer.step()
    return predict


def run_one(
    model_name: str, n_articles: int, softmax: str, negatives: int, steps: int, warmup: int, device: torch.device
) -> dict:
    n_items = N_SPECIAL + n_articles
    batches = tt.make_batches(steps, warmup=warmup, n_items=n_items, device=device)
    if model_name == "reference":
        cpu_started = time.process_time()
        result = tt.bench_reference(batches, warmup)  # training and inference, timed
        result = {k: v for k, v in result.items() if k.startswith("train") or k == "parameters_total"}
        result["cpu_seconds_all_calls"] = round(time.process_time() - cpu_started, 1)
        return {**result, **tt.peak_memory(device)}
    model = build(model_name, n_items).to(device)
    optimizer, scheduler, generator, sampler = tt.step_state(
        model, len(batches), negatives if softmax == "sampled" else None, n_items
    )
    probe = torch.randn(tt.MODEL.d_model, device=device)
    masked, candidates = [], []
    if sampler is not None:  # count the candidates a step scores
        draw = sampler.draw
        sampler.draw = lambda targets: (lambda out: (candidates.append(len(out[0])), out)[1])(draw(targets))

    def step(items, context):
        if softmax == "encoder_only":
            predict = encoder_only_step(model, optimizer, items, context, generator, probe)
        else:
            _, predict = train_step(model, optimizer, scheduler, items, context, tt.TRAIN, generator, sampler)
        masked.append(int(predict.sum()))

    model.train()
    for items, context in batches[:warmup]:
        step(items, context)
    seconds, cpu_seconds = [], []
    for items, context in batches[warmup : warmup + steps]:
        tt.synchronize(device)
        started, cpu_started = time.perf_counter(), time.process_time()
        step(items, context)
        tt.synchronize(device)
        seconds.append(time.perf_counter() - started)
        cpu_seconds.append(time.process_time() - cpu_started)
    flops = None
    try:
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter:
            step(*batches[warmup])  # a timed batch, once more
        flops = counter.get_total_flops()
    except Exception as exc:  # noqa: BLE001 - a benchmark: report what could not be counted
        print(f"flop count failed: {exc}", file=sys.stderr)
    return {
        "parameters": count_paper_parameters(model),
        **tt.rates("train", seconds),
        # CPU time of this process: on a loaded machine, what its threads got; one thread: a quiet core's rate
        "train_samples_per_cpu_s": round(tt.BATCH / (sum(cpu_seconds) / len(cpu_seconds)), 1),
        "masked_positions_per_batch": round(sum(masked) / len(masked), 1),
        "mean_width": tt.mean_width(batches[warmup:]),
        "candidates_per_batch": round(sum(candidates) / len(candidates), 1) if candidates else None,
        "flops_per_sample": round(flops / tt.BATCH) if flops else None,
        **tt.peak_memory(device),
    }


def projection(row: dict, device_type: str = "cpu") -> dict:
    """Hours of one training on H&M's full data at the measured rate (on this device), and from the FLOPs."""
    samples = HM_OUTFITS * EPOCHS
    out = {f"{device_type}_hours": round(samples / row["train_samples_per_s"] / 3600, 2)}
    if device_type == "cpu" and row.get("train_samples_per_cpu_s"):  # one quiet core's rate
        out["cpu_hours_at_cpu_time_rate"] = round(samples / row["train_samples_per_cpu_s"] / 3600, 1)
    if row.get("flops_per_sample"):
        flops = row["flops_per_sample"] * samples
        out["total_pflop"] = round(flops / 1e15, 1)
        # a floor, not a forecast: matrices of width 128 keep a GPU far from its dense bf16 peak (launches and
        # memory traffic bound it); 10% and 30% of the peak as a range. Measured on one H100: about 1% of it.
        out["h100_minutes_at_10pct_of_peak"] = round(flops / (0.10 * H100_BF16_DENSE) / 60, 1)
        out["h100_minutes_at_30pct_of_peak"] = round(flops / (0.30 * H100_BF16_DENSE) / 60, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--articles", type=int, nargs="+", default=[3_000, 30_000, 105_000])
    parser.add_argument("--models", nargs="+", default=[*VARIANTS, *ATTRS_MODELS])
    parser.add_argument("--softmax", nargs="+", default=["full", "sampled"])
    parser.add_argument("--negatives", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--note", default="")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (as train.device); cuda: bf16 autocast")
    parser.add_argument("--out", type=Path, help="default: reports/benchmarks/throughput_catalogue[_cuda].json")
    parser.add_argument(
        "--configs",
        nargs="+",
        help="model:articles:softmax, in this order (default: every "
        "model x articles x softmax, then encoder_only and the reference per size)",
    )
    parser.add_argument("--reproject", action="store_true", help="recompute the projections of --out only")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: model:articles:softmax, in its own process
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory(large_blocks=True)
    device = select_device(args.device)
    args.out = args.out or (OUT if device.type == "cpu" else OUT.with_name(f"{OUT.stem}_{device.type}.json"))

    if args.one:
        model_name, n_articles, softmax = args.one.split(":")
        row = run_one(model_name, int(n_articles), softmax, args.negatives, args.steps, args.warmup, device)
        print(json.dumps(row))
        return

    report = json.loads(args.out.read_text()) if args.out.exists() else {"results": {}}
    if args.reproject:
        for models in report["results"].values():
            for runs in models.values():
                for row in runs.values():
                    device_type = "cpu" if report["machine"].get("device", "cpu") == "cpu" else "cuda"
                    row["projection_hm_full"] = projection(row, device_type)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        return
    report.update({
        "what": "training samples/s at the paper's sizes (batch 1,024) by catalogue size, full vs sampled softmax, "
                + ("CPU fp32" if device.type == "cpu" else f"{device.type}, bf16 autocast")
                + "; each configuration in its own process (peak_rss_mib: its peak resident memory)",
        "settings": {"batch_size": tt.BATCH, "negatives": args.negatives, "timed_batches": args.steps,
                     "warmup_batches": args.warmup, "attributes": dict(ATTRIBUTES), "id_dropout": 0.5,
                     "sampler_popularity": "Zipf(1) counts; batch articles uniform", **tt.PAPER_SIZES},
        "machine": {"torch": torch.__version__, "threads": args.threads, "cpu": tt.cpu_name(),
                    "cpu_count": os.cpu_count(),
                    "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"},
        "note": args.note,
        "projection": {"outfits": HM_OUTFITS, "epochs": EPOCHS, "h100_bf16_dense_flops": H100_BF16_DENSE},
    })  # fmt: skip
    configs = [(m, n, s) for n in args.articles for m in args.models for s in args.softmax]
    configs += [("global_state_update", n, "encoder_only") for n in args.articles]
    # the reference's logits at every position: 13 GB of activations and gradients at 105k, past this machine
    configs += [] if args.no_reference else [("reference", n, "full") for n in args.articles if n <= 30_000]
    if args.configs:
        configs = [(m, int(n), s) for m, n, s in (c.split(":") for c in args.configs)]
    for model_name, n_articles, softmax in configs:
        load = os.getloadavg()
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--one", f"{model_name}:{n_articles}:{softmax}",
                               "--threads", str(args.threads), "--negatives", str(args.negatives),
                               "--steps", str(args.steps), "--warmup", str(args.warmup), "--device", args.device],
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            print(f"{model_name} {n_articles} {softmax}: failed\n{proc.stderr[-2000:]}", flush=True)
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["load_average_before"] = [round(x, 2) for x in load]
        row["projection_hm_full"] = projection(row, device.type)
        row["wall_seconds"] = round(time.perf_counter() - started, 1)
        report["results"].setdefault(str(n_articles), {}).setdefault(model_name, {})[softmax] = row
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(
            model_name,
            n_articles,
            softmax,
            row["train_samples_per_s"],
            row.get("train_samples_per_cpu_s"),
            row.get("candidates_per_batch"),
            row["peak_rss_mib"],
            flush=True,
        )


if __name__ == "__main__":
    main()
