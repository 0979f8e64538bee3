"""Exact resume and determinism, in processes of their own: a training SIGKILLed at any moment (before its first
checkpoint, mid-epoch, during the validation pass, between epochs) and started again ends with the same weights,
optimizer state, history and metrics, bit for bit, as one never interrupted; and two uninterrupted runs of one
unit are bit-identical whatever thread count the environment offers (train.num_threads decides).

Each run is a child process (`python tests/training/test_resume.py <out> <kill> <checkpoint_every_s>`) so that a kill is
a real SIGKILL: nothing is flushed, no `finally` runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
VARIANT, SEED = "global_state_update", 7
STEPS_PER_EPOCH = 10  # 300 outfits, batch 32
TIMINGS = ("seconds", "samples_per_s")


def planted_data():
    """Outfits whose style article only the context tells (a learnable signal; test_training's planted data)."""
    from contextual_bert.data.feature_spec import N_SPECIAL, PAD_INDEX, ContextSpec, EncodedOutfits, FeatureSpec

    spec = ContextSpec(
        (
            FeatureSpec("style", "categorical", "customer", N_SPECIAL + 8, 8),
            FeatureSpec("brands", "multi_categorical", "customer", N_SPECIAL + 6, 4, max_values=3),
        )
    )

    def planted(n: int, seed: int) -> EncodedOutfits:
        g = torch.Generator().manual_seed(seed)
        style = torch.randint(0, 8, (n,), generator=g)
        items = torch.zeros(n, 6, dtype=torch.long)
        items[:, :3] = N_SPECIAL + 32 + torch.rand(n, 6, generator=g).argsort(dim=1)[:, :3]
        items[:, 3] = N_SPECIAL + style * 4 + torch.randint(0, 4, (n,), generator=g)
        brands = torch.randint(N_SPECIAL, N_SPECIAL + 6, (n, 3), generator=g)
        brands[torch.rand(n, 3, generator=g) < 0.3] = PAD_INDEX
        return EncodedOutfits(items, {"style": style + N_SPECIAL, "brands": brands})

    return spec, N_SPECIAL + 38, planted(300, 0), planted(60, 1)


def child(out: Path, kill: str, checkpoint_every_s: float) -> None:
    """One training into `out`, SIGKILLed at `kill`: "none", "step:<n>" (before the n-th optimizer step of
    the process, counted from 1), "validation:<n>" (at its n-th validation pass) or "epoch_end:<n>" (after epoch
    n's last.pt and curve.json)."""
    import contextual_bert.training as training
    from contextual_bert.config import ModelConfig, TrainConfig
    from contextual_bert.model import ContextualBert

    spec, n_items, train, val = planted_data()
    from helpers import PLAIN_TRAIN

    cfg = TrainConfig(
        batch_size=32,
        max_epochs=3,
        learning_rate=3e-3,
        lr_warmup_steps=5,
        patience=5,
        device="cpu",
        num_threads=1,
        checkpoint_every_s=checkpoint_every_s,
        probe_outfits=20,  # two passes an epoch (validation, the training probe): "validation:3" is epoch 2's
        **PLAIN_TRAIN,
    )
    if os.environ.get("WARMUP") == "1":  # the bag warm-up in epochs 1-2, its "before" kept in last.pt
        cfg = cfg.model_copy(update={"bag_warmup_epochs": 2, "bag_warmup_check_steps": None})
    what, _, at = kill.partition(":")
    calls = {"step": 0, "validation": 0}

    def die_at(name: str, function):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            if what == name and calls[name] == int(at):
                os.kill(os.getpid(), signal.SIGKILL)
            return function(*args, **kwargs)

        return wrapped

    training.trainer.train_step = die_at("step", training.trainer.train_step)
    training.trainer.validation_cross_entropy = die_at("validation", training.trainer.validation_cross_entropy)
    on_epoch_end = None
    if what == "epoch_end":

        def on_epoch_end(epoch, row):
            if epoch == int(at):
                os.kill(os.getpid(), signal.SIGKILL)

    # every process starts from other weights: a resumed run must take everything from last.pt
    torch.manual_seed(os.getpid())
    model = ContextualBert(
        ModelConfig(d_model=32, n_blocks=2, n_heads=4, d_ff=64, dropout=0.2, max_set_size=6), VARIANT, n_items, spec
    )
    if not (out / "last.pt").exists():  # a fresh run: the initial weights from the seed, as `train` does
        torch.manual_seed(SEED)
        model = ContextualBert(model.model_cfg, VARIANT, n_items, spec)
    training.fit(model, train, val, cfg, out, seed=SEED, on_epoch_end=on_epoch_end)


def run_child(out: Path, kill: str = "none", checkpoint_every_s: float = 0.0, env: dict | None = None) -> int:
    src = str(HERE.parents[1] / "src")
    # the child imports the tests' helpers (`from helpers import ...`) from tests/, one folder up
    env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": os.pathsep.join([src, str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, __file__, str(out), kill, str(checkpoint_every_s)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    ).returncode


def outcome(out: Path) -> dict:
    """Everything a run leaves, less the timings: weights (best and last), optimizer, scheduler, random
    streams, curve and metrics."""
    last = torch.load(out / "last.pt", weights_only=True)
    best = torch.load(out / "checkpoint.pt", weights_only=True)
    metrics = json.loads((out / "metrics.json").read_text())
    curve = json.loads((out / "curve.json").read_text())
    return {
        "last": last["model"],
        "best": best["state_dict"],
        "best_meta": best["meta"],
        "optimizer": last["optimizer"],
        "scheduler": last["scheduler"],
        "random": last["random"],
        "state": {k: v for k, v in last["state"].items() if k not in ("curve", "seconds")},
        "curve": [{k: v for k, v in row.items() if k not in TIMINGS} for row in curve],
        "metrics": {k: v for k, v in metrics.items() if k != "seconds"},
    }


def assert_identical(a, b, where: str = "") -> None:
    """Bit-for-bit equality of nested dicts / lists of tensors and plain values (floats compared exactly)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    assert run_child(out) == 0
    return outcome(out)


KILLS = {
    # moment: (where the first process is killed, checkpoint_every_s, what last.pt then holds)
    "before_first_checkpoint": ("step:4", 0.0, None),
    "mid_epoch_with_mid_epoch_checkpoints": (f"step:{STEPS_PER_EPOCH + 6}", 1e-9, (2, 5)),
    "mid_epoch_without_them": (f"step:{STEPS_PER_EPOCH + 6}", 0.0, (1, None)),
    "in_the_validation_pass": ("validation:3", 1e-9, (2, STEPS_PER_EPOCH - 1)),  # epoch 2's validation
    "between_epochs": ("epoch_end:2", 0.0, (2, None)),
}


@pytest.mark.parametrize("moment", KILLS)
def test_a_run_killed_at_any_moment_resumes_bit_for_bit(tmp_path, uninterrupted, moment):
    kill, every_s, saved = KILLS[moment]
    assert run_child(tmp_path, kill, every_s) == -signal.SIGKILL
    if saved is None:
        assert not (tmp_path / "last.pt").exists()
    else:  # the kill left the resume state the moment names
        last = torch.load(tmp_path / "last.pt", weights_only=True)
        epochs_done, step = saved
        if step is None:
            assert last["position"] is None and last["state"]["epoch"] == epochs_done
        else:
            assert last["state"]["epoch"] == epochs_done - 1
            assert (last["position"]["epoch"], last["position"]["step"]) == (epochs_done, step)
    assert run_child(tmp_path, "none", every_s) == 0
    assert_identical(uninterrupted, outcome(tmp_path), moment)


def test_a_run_killed_during_the_bag_warmup_resumes_bit_for_bit(tmp_path):
    # last.pt then holds what the warm-up may have to give back (training.warmup.BagWarmup.begin)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert run_child(whole, env={"WARMUP": "1"}) == 0
    assert run_child(killed, f"step:{STEPS_PER_EPOCH + 6}", 1e-9, env={"WARMUP": "1"}) == -signal.SIGKILL
    assert torch.load(killed / "last.pt", weights_only=True)["state"]["bag_warmup"]["before"] is not None
    assert run_child(killed, "none", 1e-9, env={"WARMUP": "1"}) == 0
    expected = outcome(whole)
    assert [row["bag_weight"] for row in expected["curve"]] == [1.0, 0.5, 0.0]
    assert_identical(expected, outcome(killed))


def test_two_runs_of_one_unit_are_bit_identical_whatever_threads_the_machine_offers(tmp_path, uninterrupted):
    # train.num_threads (1) decides, not OMP_NUM_THREADS; and saving within epochs changes nothing
    assert run_child(tmp_path, env={"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}, checkpoint_every_s=1e-9) == 0
    assert_identical(uninterrupted, outcome(tmp_path))


AVX2_MACHINE = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def test_pinned_cpu_kernels_give_an_avx512_and_an_avx2_machine_the_same_bits(tmp_path):
    """train.cpu_kernels: avx2 (cpu_kernels.PINNED) on this CPU and on an AVX2-only one (emulated: MKL, oneDNN
    and ATen told the CPU has no more than AVX2) train to the same bits."""
    from contextual_bert.cpu_kernels import PINNED

    here, there = tmp_path / "here", tmp_path / "avx2_machine"
    assert run_child(here, env=PINNED["avx2"]) == 0
    assert run_child(there, env={**AVX2_MACHINE, **PINNED["avx2"]}) == 0
    assert_identical(outcome(here), outcome(there))


def test_the_cli_imports_no_torch_before_it_pins_the_kernels():
    code = (
        "import sys; from contextual_bert import cli, cpu_kernels; assert 'torch' not in sys.modules; "
        "assert cpu_kernels.pin('avx2'); import torch; print(torch.backends.cpu.get_cpu_capability())"
    )
    env = {k: v for k, v in os.environ.items() if k not in AVX2_MACHINE}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "AVX2"


def test_the_comparison_sees_a_difference(tmp_path, uninterrupted):
    """The tests above can fail: another seed's run, or one differing in a single bit, is told apart."""
    changed = dict(uninterrupted)
    name, weight = next(iter(uninterrupted["last"].items()))
    flipped = weight.clone()
    flipped.view(-1)[0] = torch.nextafter(flipped.view(-1)[0], torch.tensor(float("inf")))
    changed["last"] = {**uninterrupted["last"], name: flipped}
    with pytest.raises(AssertionError):
        assert_identical(uninterrupted, changed)


def test_a_training_runs_with_torchs_deterministic_algorithms_warning_where_an_op_has_none():
    script = (
        "import sys, torch\n"
        "from contextual_bert.config import TrainConfig\n"
        "from contextual_bert.training import pin_threads_and_algorithms\n"
        "pin_threads_and_algorithms(TrainConfig())\n"
        "assert torch.are_deterministic_algorithms_enabled()\n"
        "assert torch.is_deterministic_algorithms_warn_only_enabled()\n"
        "assert torch.get_num_threads() == TrainConfig().num_threads\n"
        "assert 'torch._inductor.config' not in sys.modules  # its import alone took ~1.4 s a training\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


if __name__ == "__main__":
    child(Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]))
