"""A short training's bits, per CPU model (docs/reproducibility.md, 3b): [GSU] on the tiny planted outfits, two
epochs of the real step with the sampled softmax and dropout, under each `train.cpu_kernels` setting as a training
pins it, in a process of its own. Where the bits were measured (this CPU model, this setting) they must be those
bits, elsewhere a second run's; and everywhere the validation cross-entropy lies within TOLERANCE of the one
measured (an Intel and an AMD CPU give other bits)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contextual_bert import cpu_kernels

HERE = Path(__file__).resolve().parent
# (CPU, kernels in effect) -> (SHA-256 prefix of the final weights, validation cross-entropy), torch 2.13.0. The
# CPU is /proc/cpuinfo's model name for the pinned kernels (the same bits on every model of one vendor: the
# AMD EPYCs with AVX2 only and with AVX-512 agree) and "vendor family/model" for native ones, whose bits follow
# the instruction sets. The Intel Xeon (with AVX-512, pinned to AVX2) measured at c426279, the AMD EPYC earlier:
# 1.6e-9 nats apart; the AMD EPYC's native bits at 7cff738 (family 25 model 17).
MEASURED = {
    ("AMD EPYC", "avx2"): ("148daffacee006f9", 3.015693988883868),
    ("Intel(R) Xeon(R) Processor", "avx2"): ("46858ed8c0894fa8", 3.0156939872540534),
    ("AuthenticAMD 25/17", "native"): ("9821f062b9a78532", 3.0156939981970936),
}
REFERENCE = MEASURED["AMD EPYC", "avx2"][1]
# Between MKL's AVX2 and COMPATIBLE code paths on the AMD EPYC the cross-entropy moved by 3.7e-9 nats: another
# CPU's kernels may round differently, by about that much, not by a training's worth.
TOLERANCE = 1e-6

CHILD = """
import hashlib, json, sys
from contextual_bert import cpu_kernels
cpu_kernels.pin(sys.argv[1])
import torch
sys.path[:0] = sys.argv[2:]  # this folder, for test_training; tests/, for its helpers
from test_training import N_ITEMS, TINY, new_model, planted
from contextual_bert.config import TrainConfig
from contextual_bert.training import NegativeSampler, make_optimizer, train_step, validation_cross_entropy

torch.set_num_threads(1)
cfg = TrainConfig(device="cpu", negatives=16)
model = new_model("global_state_update", 0, TINY.model_copy(update={"dropout": 0.1}))
data = planted(320, 0)
optimizer = make_optimizer(model, cfg, torch.device("cpu"))
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
generator = torch.Generator().manual_seed(0)
sampler = NegativeSampler.for_training(data.items, N_ITEMS, cfg.negatives, generator)
torch.manual_seed(0)
for epoch in range(2):
    for start in range(0, 320, 64):
        index = torch.arange(start, start + 64)
        context = {name: values[index] for name, values in data.context.items()}
        train_step(model, optimizer, scheduler, data.items[index], context, cfg, generator, sampler)
digest = hashlib.sha256()
for tensor in model.state_dict().values():
    digest.update(tensor.contiguous().numpy().tobytes())
model.eval()
ce = validation_cross_entropy(model, planted(128, 1), 256, torch.device("cpu"))
print(json.dumps([digest.hexdigest()[:16], ce, cpu_kernels.in_effect()]))
"""


def short_training(setting: str) -> tuple[str, float, dict]:
    env = {k: v for k, v in os.environ.items() if k not in cpu_kernels.VARIABLES}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, setting, str(HERE), str(HERE.parent)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    digest, ce, effect = json.loads(out.strip().splitlines()[-1])
    return digest, ce, effect


@pytest.mark.parametrize("setting", cpu_kernels.SETTINGS)
def test_a_short_training_gives_its_cpu_models_bits_and_elsewhere_its_loss_within_the_spread(setting):
    digest, ce, effect = short_training(setting)
    kernels = effect["kernels"]
    assert kernels == (effect["auto"] if setting == "auto" else setting), effect  # what was asked is what ran
    assert kernels != "avx2" or effect["aten"] == "AVX2", effect  # and torch read it
    measured = MEASURED.get((effect["cpu_family_model"], kernels)) or MEASURED.get((effect["cpu"], kernels))
    if measured:
        assert (digest, ce) == measured, f"{effect['cpu_family_model']}, {kernels}: other bits than measured on it"
    else:  # not measured on this CPU: at least a second run gives the same bits
        assert short_training(setting)[:2] == (digest, ce), f"{effect['cpu_family_model']}, {kernels}: run to run"
    assert abs(ce - REFERENCE) <= TOLERANCE, (
        f"{effect['cpu']}, {kernels}: {ce} is {ce - REFERENCE:+.2e} from {REFERENCE}"
    )


def test_a_trainings_metrics_name_the_kernels_in_effect_and_what_auto_takes_here(tmp_path):
    from test_training import SHORT, new_model, planted

    from contextual_bert.training import fit

    cfg = SHORT.model_copy(update={"max_epochs": 1})
    effect = fit(new_model("none"), planted(64, 0), planted(32, 1), cfg, tmp_path, seed=0)["cpu_kernels"]
    info = cpu_kernels.parse_cpuinfo(cpu_kernels.CPUINFO.read_text())
    assert effect["kernels"] == cpu_kernels.pinned_setting()
    assert (effect["auto"], effect["auto_measured"]) == cpu_kernels.choose(info)
    assert effect["cpu_family_model"] == f"{info['vendor']} {info['family']}/{info['model_number']}"
