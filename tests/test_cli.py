import subprocess
import sys
from pathlib import Path

from contextual_bert.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]


def test_every_dvc_stage_command_is_a_cli_subcommand():
    import yaml

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    parser = build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)
    for name, stage in stages.items():
        cmd = stage["cmd"].split()
        assert cmd[0] == "contextual-bert", name
        assert cmd[1] in commands, f"stage {name} calls unknown subcommand {cmd[1]}"


def test_bad_params_is_one_line_error_and_exit_2(tmp_path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text("model:\n  d_modle: 64\n")
    assert main(["--params", str(params), "describe-model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.d_modle" in err[0]


def test_console_script_runs_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "contextual_bert.cli", "--params", str(tmp_path / "nope.yaml"), "validate"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "nope.yaml" in result.stderr
