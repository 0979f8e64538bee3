"""The Trainer: one loop over epochs and steps, validation and early stopping (`Trainer.fit`), with the side
concerns as small objects it calls at fixed points: the bag warm-up (warmup_hook.BagWarmupHook), the offset of the
articles without an id (unseen_fit.UnseenOffset), what the run reports as it goes (tracking.Tracking) and its
files (checkpoints.Checkpoints). A run is a few typed pieces (`Run`): what it is, its data, its optimisation and
its state so far (resume.RunState, what last.pt keeps).

The step itself, the schedule and the validation measure are loop.py's; exact resume is resume.py's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from contextual_bert import cpu_kernels
from contextual_bert.config import CONTEXT_FREE, NOT_APPLICABLE, ModelConfig, TrainConfig, base_model, uses_attributes
from contextual_bert.data.feature_spec import HISTORY_FEATURE, PAD_INDEX, EncodedOutfits
from contextual_bert.devices import keep_freed_memory, select_device
from contextual_bert.errors import ContextualBertError
from contextual_bert.model import OutfitModel, build_model, count_paper_parameters
from contextual_bert.training.batches import length_batches
from contextual_bert.training.checkpoints import Checkpoints
from contextual_bert.training.count_start import start_from_counts
from contextual_bert.training.loop import (
    convergence,
    even_sample,
    lr_factor,
    make_optimizer,
    train_step,
    validation_cross_entropy,
)
from contextual_bert.training.losses import negative_sampler
from contextual_bert.training.regularisers import RareIdDecay, drop_history
from contextual_bert.training.resume import (
    CHECKPOINT_FILE,
    CURVE_FILE,
    LAST_FILE,
    METRICS_FILE,
    Position,
    RunState,
    pin_threads_and_algorithms,
    restore_random_states,
    run_key,
    seeded_random_states,
    write_json,
)
from contextual_bert.training.run import Optimisation, Run, RunData, RunSetup
from contextual_bert.training.sparse import resolve as resolve_sparse
from contextual_bert.training.tracking import EpochHook, Tracking
from contextual_bert.training.unseen_fit import UnseenOffset
from contextual_bert.training.warmup import BagWarmup
from contextual_bert.training.warmup_hook import BagWarmupHook

FIT_MAX_LINES = 80  # Trainer.fit's length: the loop must stay readable in a minute (a test holds it to this)


@dataclass
class EpochTally:
    """An epoch's steps so far: the loss summed over the targets predicted, their count, the epoch's start and the
    generator's state then (its batches): what a mid-epoch last.pt keeps (resume.Position)."""

    epoch: int
    epoch_generator: torch.Tensor
    started: float
    loss_sum: torch.Tensor
    n_targets: int | torch.Tensor = 0
    first_step: int = 0  # a resumed epoch's steps before it are done

    def add(self, loss: torch.Tensor, predict: torch.Tensor) -> None:
        count = int(predict.sum()) if predict.device.type == "cpu" else predict.sum()  # no sync on the GPU
        self.loss_sum += loss.detach().double() * count
        self.n_targets += count

    def position(self, step: int) -> Position:
        seconds = time.perf_counter() - self.started
        return Position(self.epoch, step, self.epoch_generator, self.loss_sum.cpu(), int(self.n_targets), seconds)


class Trainer:
    """Trains a run (`start` builds one) in place of its model; `fit` is the loop."""

    def __init__(self, run: Run, *, warmup: BagWarmupHook, unseen: UnseenOffset, checkpoints: Checkpoints,
                 tracking: Tracking):  # fmt: skip
        self.run, self.warmup, self.unseen, self.checkpoints, self.tracking = run, warmup, unseen, checkpoints, tracking

    def fit(self) -> dict:
        """Epochs of steps from where last.pt left off, each validated, until max_epochs or early stopping; the
        result (metrics.json). A run that has already stopped is not trained further."""
        run, setup, data, optim = self.run, self.run.setup, self.run.data, self.run.optim
        model, cfg = setup.model, setup.cfg
        resumed = self.checkpoints.resume(run)
        # patience may differ from the resumed run's: it only decides when a run stops, so a run the old patience
        # stopped goes on under a larger one, exactly as if it had had that patience from the start
        run.state.stopped = run.state.stops(cfg.patience)
        for epoch in range(run.state.epoch + 1, cfg.max_epochs + 1):
            if run.state.stopped:
                break
            state = run.state
            bag_weight = self.warmup.before_epoch(state, epoch, optim.optimizer, optim.scheduler,
                                                  lambda: self.cross_entropy(data.val))  # fmt: skip
            # --- the epoch's steps: its batches from the generator, a resumed epoch's from where it was saved
            model.train()
            batches, widths, tally = self.draw_batches(epoch, resumed)
            resumed = None
            self.checkpoints.epoch_started()
            self.tracking.start_epoch(epoch, len(data.train))
            for step, (index, width) in enumerate(zip(batches, widths)):
                if step < tally.first_step:
                    continue
                items = data.train.items[index, :width]  # right-padded: the batch without its padding columns
                context = {name: values[index] for name, values in data.train.context.items()}
                if cfg.history_dropout > 0 and HISTORY_FEATURE in context:
                    context[HISTORY_FEATURE] = drop_history(context[HISTORY_FEATURE], cfg.history_dropout,
                                                            optim.generator)  # fmt: skip
                learning_rate = float(optim.scheduler.get_last_lr()[0])  # the rate this step uses
                loss, predict = train_step(model, optim.optimizer, optim.scheduler, items, context, cfg,
                                           optim.generator, optim.sampler)  # fmt: skip
                if optim.rare_id_decay is not None:
                    optim.rare_id_decay.step(learning_rate)
                tally.add(loss, predict)
                self.tracking.step(step, len(batches), len(index), loss, tally.started)
                if self.checkpoints.due(step, len(batches)):
                    self.checkpoints.save_last(run, tally.position(step + 1))
            # --- validation, the curve, the best checkpoint and early stopping
            row = self.validated_row(tally, learning_rate)
            self.warmup.after_validation(state, row, bag_weight, epoch * run.steps_per_epoch)
            if state.record(row):
                meta = {"epoch": epoch, "val_cross_entropy": row["val_cross_entropy"], "seed": setup.seed,
                        "parameters": count_paper_parameters(model)}  # fmt: skip
                self.checkpoints.save_best(model, meta)
            self.warmup.after_record(state, row, optim.optimizer, optim.scheduler)
            state.stopped = state.stops(cfg.patience)
            self.checkpoints.save_last(run)
            self.checkpoints.write_curve(state.curve)
            self.tracking.end_epoch(epoch, row)
        return self.finish()

    def draw_batches(
        self, epoch: int, resumed: tuple[Position, dict] | None
    ) -> tuple[list[torch.Tensor], list[int], EpochTally]:
        """The epoch's batches (shuffled, outfits of similar length together: `length_batches`) and widths, drawn
        from the run's generator; within an epoch saved mid-way, the same ones, then every random stream and the
        tally where they were."""
        data, device, generator = self.run.data.train, self.run.setup.device, self.run.optim.generator
        started = time.perf_counter()
        if resumed is not None:
            generator.set_state(resumed[0].epoch_generator)
        epoch_generator = generator.get_state()
        lengths = (data.items != PAD_INDEX).sum(dim=1)
        order = torch.randperm(len(data), generator=generator, device=device)
        batches = length_batches(order, lengths, self.run.setup.cfg.batch_size, generator)
        widths = torch.stack([lengths[index].max() for index in batches]).tolist()  # one device sync
        tally = EpochTally(epoch, epoch_generator, started, torch.zeros((), dtype=torch.float64, device=device))
        if resumed is not None:
            position, random = resumed
            tally.first_step, tally.n_targets = position.step, position.n_targets
            tally.loss_sum, tally.started = position.loss_sum.to(device), started - position.seconds
            restore_random_states(random, generator, device)
        return batches, widths, tally

    def cross_entropy(self, data: EncodedOutfits) -> float:
        """The validation measure (loop.validation_cross_entropy) on `data`, in batches of 4 x the training's."""
        return validation_cross_entropy(self.run.setup.model, data, 4 * self.run.setup.cfg.batch_size,
                                        self.run.setup.device)  # fmt: skip

    def validated_row(self, tally: EpochTally, learning_rate: float) -> dict:
        """The epoch's row of the curve: the objective's loss, validation and (with a probe) training-probe
        cross-entropy, the last step's learning rate, the speed and the epoch's seconds."""
        run = self.run
        samples_per_s = len(run.data.train) / (time.perf_counter() - tally.started)
        val_ce = self.cross_entropy(run.data.val)
        if not math.isfinite(val_ce) and not math.isfinite(run.state.best_val):
            # never a result: an infinite or undefined loss cannot choose a checkpoint
            raise ContextualBertError(
                f"{run.setup.out_dir}: validation cross-entropy is {val_ce} at epoch {tally.epoch}, no checkpoint "
                "can be kept; check the validation split (`contextual-bert features` guards it: "
                "features.min_known_targets) or lower train.learning_rate if the training diverged"
            )
        probe = {} if run.data.probe is None else {"train_cross_entropy": self.cross_entropy(run.data.probe)}
        return {"epoch": tally.epoch, "train_loss": float(tally.loss_sum / tally.n_targets), **probe,
                "val_cross_entropy": val_ce, "learning_rate": learning_rate,  # at the epoch's last step
                "samples_per_s": samples_per_s, "seconds": time.perf_counter() - tally.started}  # fmt: skip

    def finish(self) -> dict:
        """After the loop: the offset fitted in the best checkpoint, the model left without the warm-up's bag, and
        metrics.json (the run's result)."""
        setup, state = self.run.setup, self.run.state
        if not math.isfinite(state.best_val):
            raise ContextualBertError(
                f"{setup.out_dir}: no epoch had a finite validation cross-entropy; no checkpoint kept"
            )
        batch_size = 4 * setup.cfg.batch_size
        self.unseen.fit_best(setup.model, self.checkpoints.best_path, self.run.data.val, batch_size, setup.device)
        self.warmup.finish()
        metrics = {
            "model": setup.model.name,
            "seed": setup.seed,
            "parameters": count_paper_parameters(setup.model),
            "epochs": state.epoch,
            "best_epoch": state.best_epoch,
            "best_val_cross_entropy": state.best_val,
            "stopped_early": state.stopped,
            "converged": convergence(state.curve, state.stopped),
            "seconds": state.seconds,
            "device": setup.device.type,
            "threads": setup.cfg.num_threads,
            "cpu_kernels": cpu_kernels.in_effect() if setup.device.type == "cpu" else None,
            **self.warmup.metrics(state),
            **self.unseen.metrics(),
            **({"sparse_recipe": setup.sparse_recipe} if setup.sparse_recipe is not None else {}),
        }
        self.checkpoints.write_metrics(metrics)
        return metrics


def start(
    model: OutfitModel,
    train_data: EncodedOutfits,
    val_data: EncodedOutfits,
    cfg: TrainConfig,
    out_dir: Path,
    seed: int,
    on_epoch_end: EpochHook | None = None,
) -> Trainer:
    """A run at its start (before any resume): `auto` settings decided, the device, the run's key, every random
    stream seeded, the optimizer and schedule, and the side concerns."""
    cfg, sparse_recipe = resolve_sparse(cfg, train_data.items)
    if cfg.init_output == "counts":  # before a resume: a resumed run loads its own weights
        start_from_counts(model, train_data.items)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if len(train_data) == 0 or len(val_data) == 0:
        raise ContextualBertError(f"{out_dir}: the train and validation splits must not be empty")
    device = select_device(cfg.device)
    pin_threads_and_algorithms(cfg)
    if device.type == "cpu":
        keep_freed_memory(large_blocks=True)
    key = run_key(model, cfg, seed, train_data, val_data, device)
    unseen = UnseenOffset.at_start(cfg, model, val_data)  # from the whole validation split
    if cfg.validation_outfits and len(val_data) > cfg.validation_outfits:
        val_data = even_sample(val_data, cfg.validation_outfits)  # early stopping reads the same sample every epoch
    model.to(device)
    train_data, val_data = train_data.to(device), val_data.to(device)
    optimizer = make_optimizer(model, cfg, device)
    steps = math.ceil(len(train_data) / cfg.batch_size) * cfg.max_epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, steps))
    generator = seeded_random_states(seed, device)
    sampler = negative_sampler(cfg, model, train_data, generator)  # draws from the generator: resumable
    if isinstance(cfg.rare_id_decay, str):  # resolve_sparse decides "auto"
        raise ContextualBertError("train.rare_id_decay 'auto' reached the trainer undecided (training.sparse.resolve)")
    rare_id_decay = RareIdDecay(model, train_data.items, cfg.rare_id_decay) if cfg.rare_id_decay > 0 else None
    # a diagnostic: nothing a training decides reads it
    probe = even_sample(train_data, min(len(val_data), cfg.probe_outfits)) if cfg.probe_outfits else None
    run = Run(
        setup=RunSetup(
            model=model, cfg=cfg, out_dir=out_dir, seed=seed, device=device, key=key, sparse_recipe=sparse_recipe
        ),
        data=RunData(train=train_data, val=val_data, probe=probe),
        optim=Optimisation(
            optimizer=optimizer, scheduler=scheduler, generator=generator, sampler=sampler, rare_id_decay=rare_id_decay
        ),
        state=RunState(bag_warmup=BagWarmup.at_start(cfg, model)),
    )
    return Trainer(
        run,
        warmup=BagWarmupHook(cfg, model, val_data, device),
        unseen=unseen,
        checkpoints=Checkpoints(out_dir, cfg.checkpoint_every_s),
        tracking=Tracking(model.name, on_epoch_end),
    )


def fit(
    model: OutfitModel,
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
    return start(model, train_data, val_data, train_cfg, out_dir, seed, on_epoch_end).fit()


def not_applicable(out_dir: Path, model_name: str, seed: int, why: str) -> dict:
    """metrics.json of a model this data cannot train: no checkpoint; evaluation and the report say why."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (CHECKPOINT_FILE, LAST_FILE, CURVE_FILE):
        (out_dir / stale).unlink(missing_ok=True)
    metrics = {"model": model_name, "seed": seed, NOT_APPLICABLE: why}
    write_json(out_dir / METRICS_FILE, metrics)
    return metrics


def model_and_splits(
    features_dir: Path, model_name: str, seed: int, model_cfg: ModelConfig, train_cfg: TrainConfig
) -> tuple[OutfitModel, EncodedOutfits, EncodedOutfits]:
    """The model, seeded and started as `train` starts it, and its training and validation splits: for a caller
    that calls `fit` itself (e.g. to measure the model between epochs)."""
    from contextual_bert.data.feature_store import load_article_vocab, load_catalogue, load_spec, load_split
    from contextual_bert.training.cooccurrence import init_from_cooccurrence

    spec = load_spec(features_dir)
    n_items = len(load_article_vocab(features_dir))
    # "<model>_attrs": the catalogue's articles, known by their attributes (items by catalogue index)
    catalogue = load_catalogue(features_dir) if uses_attributes(model_name) else None
    train_data = load_split(features_dir, "train", model_cfg.max_set_size, catalogue=catalogue is not None)
    val_data = load_split(features_dir, "val", model_cfg.max_set_size, catalogue=catalogue is not None)
    torch.manual_seed(seed)
    model = build_model(model_cfg, model_name, n_items, spec, None if catalogue is None else catalogue.spec)
    if catalogue is not None:
        model.set_catalogue(catalogue.tensors())
    if train_cfg.init_embeddings == "cooccurrence":  # before fit: a resumed run loads its own weights
        init_from_cooccurrence(model, train_data.items)
    return model, train_data, val_data


def train(
    features_dir: Path,
    out_dir: Path,
    model_name: str,
    seed: int,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    on_epoch_end: EpochHook | None = None,
) -> dict:
    """Train one (model, seed) run on the features stage's splits; see `fit`.

    Resumes from out_dir/last.pt when it was written by the same run (same model and train settings, seed
    and data; patience, device and checkpoint_every_s may differ). A run that already finished is not
    re-trained (its metrics are returned again); a run whose settings or data differ starts from scratch.
    """
    from contextual_bert.data.feature_store import load_spec

    spec = load_spec(features_dir)
    if base_model(model_name) not in CONTEXT_FREE and not spec.features:
        return not_applicable(
            out_dir,
            model_name,
            seed,
            f"'{model_name}' conditions on the customer context, and this "
            "data has no context columns (e.g. curated sets without customers)",
        )
    model, train_data, val_data = model_and_splits(features_dir, model_name, seed, model_cfg, train_cfg)
    return fit(model, train_data, val_data, train_cfg, out_dir, seed, on_epoch_end)
