"""train.cpu_kernels: auto's lookup of /proc/cpuinfo in cpu_kernels.FASTEST, and that what it chooses is what the
environment gets. (That a training then computes with it, and its bits: tests/training/test_cpu_bits.py.)"""

import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from contextual_bert import cpu_kernels
from contextual_bert.config import TrainConfig, load_config
from contextual_bert.errors import ContextualBertError

REPO = Path(__file__).resolve().parents[1]
FLAGS_AVX2 = "fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2"
FLAGS_AVX512 = FLAGS_AVX2 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16"


def cpuinfo(vendor: str, family: int, model: int, name: str, flags: str, cores: int = 2) -> str:
    block = (
        f"processor\t: {{n}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
        f"model name\t: {name}\nstepping\t: 1\nflags\t\t: {flags}\n\n"
    )
    return "".join(block.format(n=n) for n in range(cores))


# The Intel Xeon of issue 91 (2 cores, AVX-512 and AMX); its family and model numbers were not recorded, these
# are a Sapphire Rapids' (the table matches it by vendor, name and AVX-512)
INTEL_XEON = cpuinfo("GenuineIntel", 6, 143, "Intel(R) Xeon(R) Processor", FLAGS_AVX512 + " amx_bf16 amx_tile amx_int8")
AMD_EPYC_ZEN4 = cpuinfo("AuthenticAMD", 25, 17, "AMD EPYC", FLAGS_AVX512)  # this project's AMD EPYC (lscpu)
UNKNOWN = {
    "an AMD EPYC with AVX2 only": cpuinfo("AuthenticAMD", 23, 49, "AMD EPYC", FLAGS_AVX2),
    "an AMD EPYC of another family (Zen 5)": cpuinfo("AuthenticAMD", 26, 2, "AMD EPYC", FLAGS_AVX512),
    "an Intel Xeon without AVX-512": cpuinfo("GenuineIntel", 6, 79, "Intel(R) Xeon(R) Processor", FLAGS_AVX2),
    "a desktop Intel": cpuinfo("GenuineIntel", 6, 151, "12th Gen Intel(R) Core(TM) i7-12700", FLAGS_AVX2),
    "no /proc/cpuinfo fields (another architecture)": "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\n",
    "no /proc/cpuinfo": "",
}


def test_auto_takes_native_kernels_on_the_intel_xeon_measured_faster_with_them():
    assert cpu_kernels.choose(cpu_kernels.parse_cpuinfo(INTEL_XEON)) == (
        "native",
        "reports/benchmarks/cpu_kernels_genuineintel.json",
    )


def test_auto_keeps_the_avx2_path_on_the_amd_epyc_measured_faster_with_it():
    assert cpu_kernels.choose(cpu_kernels.parse_cpuinfo(AMD_EPYC_ZEN4)) == (
        "avx2",
        "reports/benchmarks/cpu_kernels_authenticamd.json",
    )


@pytest.mark.parametrize("name", UNKNOWN)
def test_a_cpu_no_measurement_names_gets_the_safe_avx2_path(name):
    assert cpu_kernels.choose(cpu_kernels.parse_cpuinfo(UNKNOWN[name])) == ("avx2", None)
    assert cpu_kernels.SAFE == "avx2"


def test_the_first_processor_is_read_and_its_fields_parsed():
    info = cpu_kernels.parse_cpuinfo(INTEL_XEON + cpuinfo("AuthenticAMD", 25, 17, "AMD EPYC", "", cores=1))
    assert (info["vendor"], info["family"], info["model_number"], info["model"]) == (
        "GenuineIntel",
        "6",
        "143",
        "Intel(R) Xeon(R) Processor",
    )
    assert {"avx512f", "amx_tile"} <= info["flags"]


@pytest.mark.parametrize("entry", cpu_kernels.FASTEST, ids=lambda e: e["cpu"]["vendor"])
def test_each_entry_rests_on_a_committed_benchmark_of_its_cpu_at_a_named_commit(entry):
    report = json.loads((REPO / entry["measured"]).read_text())
    assert report["cpu"]["vendor"] == entry["cpu"]["vendor"] and report["cpu"]["model"] == entry["cpu"]["model"]
    assert len(report["commit"]) >= 7
    ratios = [v for row in report["summary"].values() for k, v in row.items() if k.endswith("native_over_avx2")]
    assert ratios and (min(ratios) >= cpu_kernels.MARGIN) == (entry["kernels"] == "native"), ratios


@pytest.fixture
def environment(monkeypatch, tmp_path):
    """Sets the pinned variables as an inherited environment would (restored afterwards) and points the lookup
    at a fake /proc/cpuinfo; returns a function writing that file."""
    for name, value in cpu_kernels.PINNED["avx2"].items():
        monkeypatch.setenv(name, value)
    fake = tmp_path / "cpuinfo"
    monkeypatch.setattr(cpu_kernels, "CPUINFO", fake)
    return fake.write_text


def test_what_auto_chooses_is_what_the_environment_gets(environment):
    environment(INTEL_XEON)
    cpu_kernels.pin("auto")
    assert not {name for name in cpu_kernels.VARIABLES if name in os.environ}  # native: the inherited pin is gone
    assert cpu_kernels.pinned_setting() == "native"
    environment(AMD_EPYC_ZEN4)
    cpu_kernels.pin("auto")
    assert {name: os.environ.get(name) for name in cpu_kernels.VARIABLES} == cpu_kernels.PINNED["avx2"]
    assert cpu_kernels.pinned_setting() == "avx2"
    environment(INTEL_XEON)
    cpu_kernels.pin("avx2")  # an explicit setting is kept whatever the CPU
    assert cpu_kernels.pinned_setting() == "avx2"


def test_an_unknown_setting_is_refused_in_one_line_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"^train\.cpu_kernels: 'fast' is none of auto, avx2, native$"):
        cpu_kernels.pin("fast")
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  cpu_kernels: fast\n")
    with pytest.raises(ContextualBertError, match=r"'train\.cpu_kernels': Input should be 'auto', 'avx2' or 'native'"):
        load_config(path)


def test_the_config_offers_the_settings_cpu_kernels_knows_and_defaults_to_auto():
    assert typing.get_args(TrainConfig.model_fields["cpu_kernels"].annotation) == cpu_kernels.SETTINGS
    assert TrainConfig().cpu_kernels == "auto"


def test_a_script_that_imported_torch_restarts_under_the_setting_it_pins(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "import sys, torch\n"
        "from contextual_bert import cpu_kernels\n"
        "cpu_kernels.pin_or_restart(sys.argv[1])\n"
        "print(torch.backends.cpu.get_cpu_capability(), cpu_kernels.pinned_setting())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in cpu_kernels.VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, str(script), "avx2"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["AVX2", "avx2"]  # without the restart torch would have read no pin
