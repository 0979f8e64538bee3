"""Masked-item training: the loop.

Every step masks at least one item of every outfit and minimises the loss over the real articles at the masked
positions (losses.py). AdamW with linear warm-up, then a cosine (or linear) decay to train.min_lr_fraction of
the rate at max_epochs; gradients clipped to a global norm; early stopping on the validation cross-entropy
(every item of every validation outfit masked in turn, as in evaluation).

The objective's loss is not comparable with validation: 10% of the masked positions keep their article, and
several items are masked at once. Every epoch therefore also reports `train_cross_entropy`, the validation's
measure on a fixed sample of training outfits: their gap is the overfitting. A run records whether it
converged: early stopping fired, or its last CONVERGENCE_EPOCHS epochs together improved the best validation
cross-entropy by less than CONVERGENCE_NATS.

Devices: the data is moved to the device once and batches are indexed from it with a shuffled permutation
(no DataLoader), outfits of similar length together and each batch trimmed to its longest (`length_batches`);
fused AdamW. On CUDA, bf16 autocast. On the CPU, fp32, and glibc told to keep freed memory.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from contextual_bert import cpu_kernels
from contextual_bert.config import CONTEXT_FREE, NOT_APPLICABLE, ModelConfig, TrainConfig, base_model, uses_attributes
from contextual_bert.data.feature_spec import HISTORY_FEATURE, PAD_INDEX, EncodedOutfits
from contextual_bert.devices import autocast, keep_freed_memory, select_device
from contextual_bert.errors import ContextualBertError
from contextual_bert.model import build_model, count_paper_parameters, save_checkpoint
from contextual_bert.training.batches import BUCKET_BATCHES, length_batches  # noqa: F401
from contextual_bert.training.count_start import start_from_counts
from contextual_bert.training.losses import NegativeSampler, mask_items, masked_item_loss, negative_sampler
from contextual_bert.training.regularisers import RareIdDecay, drop_history, id_dropout_rate, unseen_share
from contextual_bert.training.resume import (
    CHECKPOINT_FILE,
    CURVE_FILE,
    LAST_FILE,
    METRICS_FILE,
    Position,
    RunState,
    load_resume_state,
    pin_threads_and_algorithms,
    restore_random_states,
    run_key,
    save_resume_state,
    seeded_random_states,
    write_json,
)
from contextual_bert.training.sparse import resolve as resolve_sparse
from contextual_bert.training.unseen_fit import fit_unseen_offset
from contextual_bert.training.warmup import BagWarmup, reads_bag_warmup, set_bag_weight, stuck_check

EpochHook = Callable[[int, dict], None]  # (epoch, its row of the curve)
CONVERGENCE_EPOCHS, CONVERGENCE_NATS = 3, 0.01


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """Fused AdamW; weight decay on matrices and embeddings only, not on biases and LayerNorm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, fused=True)  # one kernel; 3-4x faster on the CPU


def train_step(model, optimizer, scheduler, items, context, cfg: TrainConfig, generator, sampler=None):
    """One optimisation step on a batch of outfits; returns the loss and the positions predicted. `sampler`:
    the sampled softmax's (`negative_sampler`), None for the full softmax."""
    inputs, predict = mask_items(items, model.n_items, cfg, generator)
    with autocast(items.device):
        loss = masked_item_loss(model, inputs, context, predict, items, sampler)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
    optimizer.step()
    scheduler.step()
    return loss.detach(), predict


def lr_factor(cfg: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """The learning rate's multiplier at optimizer step `step` (0-based): linear warm-up over
    cfg.lr_warmup_steps, then cfg.schedule ("cosine", "linear" or "constant") from 1 down to
    cfg.min_lr_fraction at total_steps (and held there)."""
    warmup, floor = cfg.lr_warmup_steps, cfg.min_lr_fraction

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1.0 - progress
        return floor + (1.0 - floor) * decay

    return factor


def convergence(curve: list[dict], stopped_early: bool) -> str | None:
    """How a run converged: "early_stopping", "plateau" (its last CONVERGENCE_EPOCHS epochs improved the
    best validation cross-entropy by less than CONVERGENCE_NATS together), or None (still improving)."""
    if stopped_early:
        return "early_stopping"
    values = [row["val_cross_entropy"] for row in curve]
    if len(values) <= CONVERGENCE_EPOCHS:
        return None
    gained = min(values[:-CONVERGENCE_EPOCHS]) - min(values)
    return "plateau" if gained < CONVERGENCE_NATS else None


def validation_cross_entropy(model, data: EncodedOutfits, batch_size: int, device: torch.device | str) -> float:
    """Mean cross-entropy with every item of every outfit masked in turn (the evaluation's cases)."""
    from contextual_bert.evaluation.ranking import case_ranks

    cases = case_ranks(model, data, batch_size, device, with_ranks=False)
    return float(-cases["log_prob"].mean()) if len(cases["log_prob"]) else float("nan")


def even_sample(train_data: EncodedOutfits, n: int) -> EncodedOutfits:
    """A fixed sample of n outfits of a split, evenly spaced (the split's order is already a hash order)."""
    n = min(n, len(train_data))
    return train_data.subset(torch.linspace(0, len(train_data) - 1, n).round().long().unique())


@dataclass
class Run:
    """One training while it runs: what fit's parts share."""

    model: torch.nn.Module
    cfg: TrainConfig
    out_dir: Path
    seed: int
    device: torch.device
    key: dict
    train_data: EncodedOutfits
    val_data: EncodedOutfits
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    generator: torch.Generator
    sampler: NegativeSampler | None
    state: RunState
    id_dropout: float | None = None
    rare_id_decay: RareIdDecay | None = None
    sparse_recipe: dict | None = None  # what train.init_output / rare_id_decay "auto" decided (training/sparse.py)
    unseen_offset: float | None = None  # the "_attrs" models' offset of the articles without an id (calibrate_unseen)
    unseen_fit: dict | None = None  # that offset moved to its validation optimum after training (unseen_fit.py)

    @property
    def last_path(self) -> Path:
        return self.out_dir / LAST_FILE

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.train_data) / self.cfg.batch_size)

    def save(self, position: Position | None = None) -> None:
        save_resume_state(
            self.last_path,
            self.key,
            self.model,
            self.optimizer,
            self.scheduler,
            self.generator,
            self.device,
            self.state,
            position,
        )


def start_run(
    model, train_data: EncodedOutfits, val_data: EncodedOutfits, cfg: TrainConfig, out_dir: Path, seed: int
) -> Run:
    """The device, the run's key, the optimizer and schedule, every random stream seeded, and the state of a run
    at its start (before any resume)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if len(train_data) == 0 or len(val_data) == 0:
        raise ContextualBertError(f"{out_dir}: the train and validation splits must not be empty")
    device = select_device(cfg.device)
    pin_threads_and_algorithms(cfg)
    if device.type == "cpu":
        keep_freed_memory(large_blocks=True)
    key = run_key(model, cfg, seed, train_data, val_data, device)
    id_dropout, unseen_offset = None, None
    if uses_attributes(model.variant):  # read by "_attrs" models only: the paper's models train as before
        id_dropout = id_dropout_rate(cfg.id_dropout, model, val_data)
        model.set_id_dropout(id_dropout, unseen_share(model, val_data))
        unseen_offset = model.attributes.unseen_offset
    if cfg.validation_outfits and len(val_data) > cfg.validation_outfits:
        # early stopping reads the same sample every epoch
        val_data = even_sample(val_data, cfg.validation_outfits)
    model.to(device)
    train_data, val_data = train_data.to(device), val_data.to(device)
    optimizer = make_optimizer(model, cfg, device)
    steps = math.ceil(len(train_data) / cfg.batch_size) * cfg.max_epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, steps))
    generator = seeded_random_states(seed, device)
    sampler = negative_sampler(cfg, model, train_data, generator)  # draws from the generator: resumable
    state = RunState(bag_warmup=BagWarmup.at_start(cfg, model))
    if isinstance(cfg.rare_id_decay, str):  # fit decides "auto" before it starts a run
        raise ContextualBertError("train.rare_id_decay 'auto' reached start_run undecided (training.sparse.resolve)")
    rare_id_decay = RareIdDecay(model, train_data.items, cfg.rare_id_decay) if cfg.rare_id_decay > 0 else None
    return Run(
        model,
        cfg,
        out_dir,
        seed,
        device,
        key,
        train_data,
        val_data,
        optimizer,
        scheduler,
        generator,
        sampler,
        state,
        id_dropout,
        rare_id_decay,
        unseen_offset=unseen_offset,
    )


def train_epoch(run: Run, epoch: int, position: Position | None, mid_epoch_random: dict | None) -> dict:
    """One epoch's steps (from `position` within it, for a resumed run, with the random states saved there);
    its row of the curve without the validation: the objective's loss, the last step's learning rate and the
    training's speed."""
    model, cfg, data, generator, device = run.model, run.cfg, run.train_data, run.generator, run.device
    started = saved_at = time.perf_counter()
    model.train()
    if position is not None:  # resumed within this epoch: its batches from the generator's state at its start
        generator.set_state(position.epoch_generator)
    epoch_generator = generator.get_state()
    lengths = (data.items != PAD_INDEX).sum(dim=1)
    batches = length_batches(
        torch.randperm(len(data), generator=generator, device=device), lengths, cfg.batch_size, generator
    )
    widths = torch.stack([lengths[index].max() for index in batches]).tolist()  # one device sync
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    n_targets: int | torch.Tensor = 0
    first_step = 0
    if position is not None and mid_epoch_random is not None:  # then every stream where it was, the steps done skipped
        first_step = position.step
        loss_sum, n_targets = position.loss_sum.to(device), position.n_targets
        started -= position.seconds
        restore_random_states(mid_epoch_random, generator, device)
    bar = tqdm(total=len(data), desc=f"{model.variant} epoch {epoch}", unit="outfit", leave=False,
               mininterval=1.0, dynamic_ncols=True)  # fmt: skip
    for step, (index, width) in enumerate(zip(batches, widths)):
        if step < first_step:
            continue
        items = data.items[index, :width]  # right-padded: the batch without its padding columns
        context = {name: values[index] for name, values in data.context.items()}
        if cfg.history_dropout > 0 and HISTORY_FEATURE in context:
            context[HISTORY_FEATURE] = drop_history(context[HISTORY_FEATURE], cfg.history_dropout, generator)
        learning_rate = float(run.scheduler.get_last_lr()[0])  # the rate this step uses
        loss, predict = train_step(model, run.optimizer, run.scheduler, items, context, cfg, generator, run.sampler)
        if run.rare_id_decay is not None:
            run.rare_id_decay.step(learning_rate)
        count = int(predict.sum()) if device.type == "cpu" else predict.sum()
        loss_sum += loss.detach().double() * count
        n_targets += count
        bar.update(len(index))
        if step % 20 == 0 or step == run.steps_per_epoch - 1:
            elapsed = time.perf_counter() - started
            bar.set_postfix(loss=f"{float(loss):.3f}", samples_per_s=f"{bar.n / max(elapsed, 1e-9):.0f}")
        if (
            cfg.checkpoint_every_s > 0
            and step + 1 < len(batches)
            and time.perf_counter() - saved_at >= cfg.checkpoint_every_s
        ):
            run.save(
                Position(
                    epoch, step + 1, epoch_generator, loss_sum.cpu(), int(n_targets), time.perf_counter() - started
                )
            )
            saved_at = time.perf_counter()
    bar.close()
    return {
        "epoch": epoch,
        "train_loss": float(loss_sum / n_targets),
        "learning_rate": learning_rate,
        "samples_per_s": len(data) / (time.perf_counter() - started),
        "started": started,
    }


def validate_epoch(run: Run, row: dict, train_probe: EncodedOutfits | None) -> dict:
    """The epoch's row completed: validation and (with a probe) training-probe cross-entropy, its seconds."""
    batch_size, epoch = 4 * run.cfg.batch_size, row["epoch"]
    val_ce = validation_cross_entropy(run.model, run.val_data, batch_size, run.device)
    if not math.isfinite(val_ce) and not math.isfinite(run.state.best_val):
        # never a result: an infinite or undefined loss cannot choose a checkpoint
        raise ContextualBertError(
            f"{run.out_dir}: validation cross-entropy is {val_ce} at epoch {epoch}, no checkpoint can be kept; "
            "check the validation split (`contextual-bert features` guards it: features.min_known_targets) "
            "or lower train.learning_rate if the training diverged"
        )
    started = row.pop("started")
    probe = (
        {}
        if train_probe is None
        else {"train_cross_entropy": validation_cross_entropy(run.model, train_probe, batch_size, run.device)}
    )
    row = {"epoch": epoch, "train_loss": row["train_loss"], **probe,
           "val_cross_entropy": val_ce, "learning_rate": row["learning_rate"],  # at the epoch's last step
           "samples_per_s": row["samples_per_s"], "seconds": time.perf_counter() - started}  # fmt: skip
    return row


def begin_epoch(run: Run, epoch: int) -> float:
    """The bag warm-up's weight for the epoch's steps; at its first epoch, the warm-up begun (what the run has
    before it kept). Returns the weight."""
    warmup, cfg = run.state.bag_warmup, run.cfg
    weight = warmup.weight(cfg, run.model, epoch)
    if warmup.phase == "planned" and epoch in warmup.epochs(cfg, run.model):
        best = run.state.best_val  # a warm-up from epoch 1 is judged against the untrained model
        warmup.begin(
            run.model,
            run.optimizer,
            run.scheduler,
            best
            if math.isfinite(best)
            else validation_cross_entropy(run.model, run.val_data, 4 * cfg.batch_size, run.device),
            run.state.bad_epochs,
        )
    set_bag_weight(run.model, weight)
    return weight


def end_epoch(run: Run, row: dict, bag_weight: float, n_params: int) -> None:
    """The warm-up's check, early stopping, the best checkpoint, the warm-up's end, last.pt and the curve."""
    state, warmup, cfg, epoch = run.state, run.state.bag_warmup, run.cfg, row["epoch"]
    if reads_bag_warmup(cfg, run.model):
        row["bag_weight"] = bag_weight
        check_steps = cfg.bag_warmup_check_steps
        if warmup.phase == "due" and check_steps is not None and epoch * run.steps_per_epoch >= check_steps:
            warmup.checked(stuck_check(run.model, run.val_data, 4 * cfg.batch_size, run.device, epoch))
            row["outfit_dependence"] = warmup.outfit_dependence
    state.curve.append(row)
    state.epoch = epoch
    state.seconds += row["seconds"]
    if row["val_cross_entropy"] < state.best_val:
        state.best_val, state.best_epoch, state.bad_epochs = row["val_cross_entropy"], epoch, 0
        save_checkpoint(
            run.out_dir / CHECKPOINT_FILE,
            run.model,
            {"epoch": epoch, "val_cross_entropy": row["val_cross_entropy"], "seed": run.seed, "parameters": n_params},
        )
    else:
        state.bad_epochs += 1
    if warmup.phase == "running" and epoch == warmup.epochs(cfg, run.model)[-1]:
        bad_epochs_before = warmup.end(state.best_val, run.model, run.optimizer, run.scheduler)
        row["bag_warmup_restored"] = bad_epochs_before is not None
        if bad_epochs_before is not None:
            state.bad_epochs = bad_epochs_before
    state.stopped = stops(state, cfg.patience)
    run.save()
    write_json(run.out_dir / CURVE_FILE, state.curve)


def stops(state: RunState, patience: int) -> bool:
    """Early stopping: `patience` epochs without a better validation cross-entropy; never within a warm-up
    (it is judged at its end)."""
    return state.bad_epochs >= patience and state.bag_warmup.phase != "running"


def fit(
    model,
    train_data: EncodedOutfits,
    val_data: EncodedOutfits,
    train_cfg: TrainConfig,
    out_dir: Path,
    seed: int,
    on_epoch_end: EpochHook | None = None,
) -> dict:
    """Train `model` in place; resume from out_dir/last.pt when it belongs to the same run.

    Writes out_dir/checkpoint.pt (best validation cross-entropy), last.pt (resume state, every epoch),
    curve.json (the training curve: one row per epoch) and metrics.json, which is also returned. A run that has
    already stopped (at max_epochs, or early under the current patience) is not trained further; a larger
    patience continues a run that stopped early, as if it had had that patience from the start; a new
    max_epochs (the decay's horizon) starts it afresh.
    """
    train_cfg, sparse_recipe = resolve_sparse(train_cfg, train_data.items)
    if train_cfg.init_output == "counts":  # before a resume: a resumed run loads its own weights
        start_from_counts(model, train_data.items)
    run = start_run(model, train_data, val_data, train_cfg, Path(out_dir), seed)
    run.sparse_recipe = sparse_recipe
    train_probe = (  # a diagnostic: nothing a training decides reads it
        even_sample(run.train_data, min(len(run.val_data), train_cfg.probe_outfits))
        if train_cfg.probe_outfits
        else None
    )
    position, mid_epoch_random = None, None
    resumed = load_resume_state(run.last_path, run.key, model, run.optimizer, run.scheduler, run.generator, run.device)
    if resumed is not None:
        run.state, position, mid_epoch_random = resumed
        # patience may differ: it only decides when a run stops, so a run the old patience stopped goes
        # on under a larger one, exactly as if it had had that patience from the start
        run.state.stopped = stops(run.state, train_cfg.patience)

    n_params = count_paper_parameters(model)
    for epoch in range(run.state.epoch + 1, train_cfg.max_epochs + 1):
        if run.state.stopped:
            break
        bag_weight = begin_epoch(run, epoch)
        row = train_epoch(run, epoch, position, mid_epoch_random)
        position = None
        row = validate_epoch(run, row, train_probe)
        end_epoch(run, row, bag_weight, n_params)
        if on_epoch_end is not None:
            on_epoch_end(epoch, row)
    run.unseen_fit = fit_best_unseen_offset(run)
    set_bag_weight(model, 0.0)
    return finish_run(run, n_params)


def fit_best_unseen_offset(run: Run) -> dict | None:
    """An "_attrs" model's best checkpoint with its offset of the articles without an id fitted on validation
    (unseen_fit.py), from the offset training started with, so that a finished run asked again fits the same."""
    if run.id_dropout is None or not math.isfinite(run.state.best_val):
        return None
    path = run.out_dir / CHECKPOINT_FILE
    payload = torch.load(path, map_location="cpu", weights_only=True)
    run.model.load_state_dict(payload["state_dict"])
    fit = fit_unseen_offset(run.model, run.val_data, 4 * run.cfg.batch_size, run.device, start=run.unseen_offset)
    if fit is not None:
        save_checkpoint(path, run.model, {**payload.get("meta", {}), "unseen_offset_fit": fit})
    return fit


def finish_run(run: Run, n_params: int) -> dict:
    """metrics.json: the run's result."""
    state = run.state
    if not math.isfinite(state.best_val):
        raise ContextualBertError(f"{run.out_dir}: no epoch had a finite validation cross-entropy; no checkpoint kept")
    metrics = {
        "variant": run.model.variant,
        "seed": run.seed,
        "parameters": n_params,
        "epochs": state.epoch,
        "best_epoch": state.best_epoch,
        "best_val_cross_entropy": state.best_val,
        "stopped_early": state.stopped,
        "converged": convergence(state.curve, state.stopped),
        "seconds": state.seconds,
        "device": run.device.type,
        "threads": run.cfg.num_threads,
        "cpu_kernels": cpu_kernels.in_effect() if run.device.type == "cpu" else None,
        **(
            {"bag_warmup": state.bag_warmup.summary()}
            if reads_bag_warmup(run.cfg, run.model) and state.bag_warmup.phase != "due"
            else {}
        ),
        **offset_metrics(run),
        **({"sparse_recipe": run.sparse_recipe} if run.sparse_recipe is not None else {}),
    }
    write_json(run.out_dir / METRICS_FILE, metrics)
    return metrics


def offset_metrics(run: Run) -> dict:
    """An "_attrs" model's id dropout and the offset of its articles without an id (fitted, where it was)."""
    if run.id_dropout is None:
        return {}
    if run.unseen_fit is None:
        return {"id_dropout": run.id_dropout, "unseen_offset": run.unseen_offset}
    return {
        "id_dropout": run.id_dropout,
        "unseen_offset": run.unseen_fit["offset"],
        "unseen_offset_fit": run.unseen_fit,
    }


def not_applicable(out_dir: Path, variant: str, seed: int, why: str) -> dict:
    """metrics.json of a model this data cannot train: no checkpoint; evaluation and the report say why."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (CHECKPOINT_FILE, LAST_FILE, CURVE_FILE):
        (out_dir / stale).unlink(missing_ok=True)
    metrics = {"variant": variant, "seed": seed, NOT_APPLICABLE: why}
    write_json(out_dir / METRICS_FILE, metrics)
    return metrics


def train(
    features_dir: Path,
    out_dir: Path,
    variant: str,
    seed: int,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    on_epoch_end: EpochHook | None = None,
) -> dict:
    """Train one (variant, seed) run on the features stage's splits; see `fit`.

    Resumes from out_dir/last.pt when it was written by the same run (same model and train settings, seed
    and data; patience, device and checkpoint_every_s may differ). A run that already finished is not
    re-trained (its metrics are returned again); a run whose settings or data differ starts from scratch.
    """
    from contextual_bert.data.feature_store import load_article_vocab, load_catalogue, load_spec, load_split
    from contextual_bert.training.cooccurrence import init_from_cooccurrence

    spec = load_spec(features_dir)
    if base_model(variant) not in CONTEXT_FREE and not spec.features:
        return not_applicable(
            out_dir,
            variant,
            seed,
            f"'{variant}' conditions on the customer context, and this "
            "data has no context columns (e.g. curated sets without customers)",
        )
    n_items = len(load_article_vocab(features_dir))
    # "<model>_attrs": the catalogue's articles, known by their attributes (items by catalogue index)
    catalogue = load_catalogue(features_dir) if uses_attributes(variant) else None
    train_data = load_split(features_dir, "train", model_cfg.max_set_size, catalogue=catalogue is not None)
    val_data = load_split(features_dir, "val", model_cfg.max_set_size, catalogue=catalogue is not None)
    torch.manual_seed(seed)
    model = build_model(model_cfg, variant, n_items, spec, None if catalogue is None else catalogue.spec)
    if catalogue is not None:
        model.set_catalogue(catalogue.tensors())
    if train_cfg.init_embeddings == "cooccurrence":  # before fit: a resumed run loads its own weights
        init_from_cooccurrence(model, train_data.items)
    return fit(model, train_data, val_data, train_cfg, out_dir, seed, on_epoch_end)
