"""The Trainer's parts, each alone: fit's length, a run's typed pieces, early stopping's record, and the side
concerns the loop calls at fixed points (checkpoints, tracking, the bag warm-up, the offset of the articles without
an id). The whole loop's behaviour is test_training.py's and test_resume.py's."""

import dataclasses
import inspect
import json
import math
from pathlib import Path

import pytest
import torch
from helpers import PLAIN_TRAIN
from test_training import N_ITEMS, SPEC, TINY, new_model, planted

from contextual_bert.config import TrainConfig
from contextual_bert.data.feature_spec import N_SPECIAL, ContextSpec, EncodedOutfits, FeatureSpec
from contextual_bert.model import OutfitBag, build_model
from contextual_bert.training import (
    BagWarmup,
    BagWarmupHook,
    Checkpoints,
    Optimisation,
    Position,
    Run,
    RunData,
    RunSetup,
    RunState,
    Tracking,
    Trainer,
    UnseenOffset,
    make_optimizer,
    run_key,
)
from contextual_bert.training.trainer import FIT_MAX_LINES

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SRC = Path(__file__).resolve().parents[2] / "src"


def test_fit_reads_in_a_minute_and_no_module_of_the_library_is_over_500_lines():
    assert len(inspect.getsource(Trainer.fit).splitlines()) <= FIT_MAX_LINES
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


def small_run(tmp_path: Path, cfg: TrainConfig | None = None, model_name: str = "none") -> Run:
    cfg = cfg or TrainConfig(batch_size=32, device="cpu", **PLAIN_TRAIN)
    model, train, val = new_model(model_name), planted(64, 0), planted(32, 1)
    optimizer = make_optimizer(model, cfg, torch.device("cpu"))
    return Run(
        setup=RunSetup(
            model=model,
            cfg=cfg,
            out_dir=tmp_path,
            seed=0,
            device=torch.device("cpu"),
            key=run_key(model, cfg, 0, train, val, "cpu"),
        ),
        data=RunData(train=train, val=val),
        optim=Optimisation(
            optimizer=optimizer,
            scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
            generator=torch.Generator().manual_seed(0),
        ),
        state=RunState(),
    )


def test_a_run_is_built_of_its_pieces_by_keyword_only(tmp_path):
    run = small_run(tmp_path)
    with pytest.raises(TypeError):
        Run(run.setup, run.data, run.optim, run.state)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.setup.seed = 1  # type: ignore[misc]
    assert run.steps_per_epoch == 2  # 64 outfits, batch 32


def test_the_state_records_the_best_epoch_and_stops_after_patience_but_never_within_a_warmup():
    state = RunState()
    assert [state.record({"epoch": e, "val_cross_entropy": v, "seconds": 1.0}) for e, v in
            enumerate([3.0, 2.5, 2.7, 2.6], 1)] == [True, True, False, False]  # fmt: skip
    assert (state.epoch, state.best_epoch, state.best_val, state.bad_epochs, state.seconds) == (4, 2, 2.5, 2, 4.0)
    assert state.stops(2) and not state.stops(3)
    state.bag_warmup = BagWarmup(start=1, before={})  # running
    assert not state.stops(2)


def test_checkpoints_are_due_every_so_many_seconds_within_an_epoch_never_after_its_last_step(tmp_path):
    never, always = Checkpoints(tmp_path, 0.0), Checkpoints(tmp_path, 1e-9)
    assert not never.due(0, 10)
    assert always.due(0, 10) and always.due(8, 10) and not always.due(9, 10)
    hourly = Checkpoints(tmp_path, 3600.0)
    assert not hourly.due(0, 10)
    hourly.saved_at -= 3601
    assert hourly.due(0, 10)


def test_checkpoints_resume_what_they_saved_mid_epoch_and_drop_another_runs(tmp_path):
    run = small_run(tmp_path)
    checkpoints = Checkpoints(tmp_path, 1e-9)
    assert checkpoints.resume(run) is None  # nothing saved yet
    run.state.record({"epoch": 1, "val_cross_entropy": 2.0, "seconds": 1.0})
    position = Position(2, 1, run.optim.generator.get_state(), torch.tensor(3.0, dtype=torch.float64), 7, 0.5)
    checkpoints.save_last(run, position)
    checkpoints.save_best(run.setup.model, {"epoch": 1})
    checkpoints.write_curve(run.state.curve)
    checkpoints.write_metrics({"best_epoch": 1})
    assert json.loads((tmp_path / "curve.json").read_text()) == run.state.curve
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"best_epoch": 1}

    again = small_run(tmp_path)
    resumed = checkpoints.resume(again)
    assert resumed is not None and (resumed[0].epoch, resumed[0].step, resumed[0].n_targets) == (2, 1, 7)
    assert again.state.curve == run.state.curve and again.state.best_val == 2.0

    other = small_run(tmp_path, TrainConfig(batch_size=16, device="cpu", **PLAIN_TRAIN))  # another key
    assert checkpoints.resume(other) is None
    assert not checkpoints.last_path.exists() and not checkpoints.best_path.exists()


def test_tracking_calls_the_epoch_hook_with_the_row_and_closes_its_bar():
    calls = []
    tracking = Tracking("none", lambda epoch, row: calls.append((epoch, row)))
    tracking.start_epoch(1, 64)
    tracking.step(0, 2, 32, torch.tensor(1.5), started=0.0)
    tracking.step(1, 2, 32, torch.tensor(1.4), started=0.0)
    assert tracking.bar is not None and tracking.bar.n == 64
    tracking.end_epoch(1, {"epoch": 1})
    assert calls == [(1, {"epoch": 1})] and tracking.bar is None
    Tracking("none").end_epoch(1, {})  # no hook: nothing to call


def test_the_warmup_hook_weighs_the_bag_begins_and_gives_the_run_back_when_it_did_not_lift(tmp_path):
    cfg = TrainConfig(batch_size=32, device="cpu", **{**PLAIN_TRAIN, "bag_warmup_epochs": 2})
    run = small_run(tmp_path, cfg, "global_state")
    model, optim, state = run.setup.model, run.optim, run.state
    state.bag_warmup = BagWarmup.at_start(cfg, model)
    hook = BagWarmupHook(cfg, model, run.data.val, torch.device("cpu"))
    measured = []
    before = {k: v.clone() for k, v in model.state_dict().items()}

    assert hook.before_epoch(state, 1, optim.optimizer, optim.scheduler, lambda: measured.append(1) or 2.0) == 1.0
    assert measured == [1] and state.bag_warmup.phase == "running" and state.bag_warmup.before["best_val"] == 2.0
    with torch.no_grad():
        model.item_embeddings.weight.add_(1.0)  # what the warm-up's epochs trained
    for epoch, weight in ((1, 1.0), (2, 0.5)):
        assert hook.before_epoch(state, epoch, optim.optimizer, optim.scheduler, lambda: math.nan) == weight
        row = {"epoch": epoch, "val_cross_entropy": 2.5, "seconds": 1.0}  # worse than before it
        hook.after_validation(state, row, weight, steps_done=epoch * 2)
        state.record(row)
        hook.after_record(state, row, optim.optimizer, optim.scheduler)
    assert row == {"epoch": 2, "val_cross_entropy": 2.5, "seconds": 1.0, "bag_weight": 0.5, "bag_warmup_restored": True}
    assert state.bag_warmup.phase == "ended" and state.bad_epochs == 0  # the count from before it
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert hook.metrics(state) == {"bag_warmup": {"from": 1, "lifted": False}}
    hook.finish()
    assert model.reader(OutfitBag).warmup_weight == 0.0


def test_the_warmup_hook_does_nothing_for_a_model_that_does_not_read_it(tmp_path):
    cfg = TrainConfig(batch_size=32, device="cpu", **{**PLAIN_TRAIN, "bag_warmup_epochs": 2})
    bag = build_model(TINY, "bag_of_items", N_ITEMS, SPEC)
    state, row = RunState(bag_warmup=BagWarmup.at_start(cfg, bag)), {"epoch": 1}
    hook = BagWarmupHook(cfg, bag, planted(8, 0), torch.device("cpu"))
    assert hook.before_epoch(state, 1, None, None, lambda: pytest.fail("nothing to measure")) == 0.0
    hook.after_validation(state, row, 0.0, steps_done=100)
    assert not hook.applies and row == {"epoch": 1} and hook.metrics(state) == {}


def test_the_unseen_offset_is_set_at_the_start_for_an_attrs_model_only_and_said_in_the_metrics():
    ids_only = UnseenOffset.at_start(TrainConfig(id_dropout=0.3), new_model("none"), planted(8, 0))
    assert ids_only.metrics() == {}
    ids_only.fit_best(new_model("none"), Path("/nonexistent"), planted(8, 0), 8, torch.device("cpu"))  # nothing read

    n_ids = N_SPECIAL + 16
    model = build_model(TINY, "none_attrs", n_ids, ContextSpec(()),
                        ContextSpec((FeatureSpec("colour", "categorical", "article", N_SPECIAL + 3, 4),)))  # fmt: skip
    model.set_catalogue({"colour": torch.randint(N_SPECIAL, N_SPECIAL + 3, (n_ids + 8,))})
    val = EncodedOutfits(torch.tensor([[N_SPECIAL, n_ids + 1, 0, 0], [N_SPECIAL + 1, N_SPECIAL + 2, 0, 0]]), {})
    unseen = UnseenOffset.at_start(TrainConfig(id_dropout=0.3), model, val)
    assert model.attributes.id_dropout == 0.3 and unseen.start == model.attributes.unseen_offset > 0
    assert unseen.metrics() == {"id_dropout": 0.3, "unseen_offset": unseen.start}
