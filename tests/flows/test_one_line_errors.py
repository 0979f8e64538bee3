"""The flow modules' command lines: a user error is one line and exit 2, as with `contextual-bert`."""

from __future__ import annotations

import re

import pytest

from contextual_bert.errors import ContextualBertError
from flows import one_line_errors
from flows.infra.dvc_stages import StageFailed
from flows.pipeline import main as pipeline_main


def test_user_errors_are_one_line_and_other_failures_keep_their_traceback(capsys):
    def failing(exc):
        @one_line_errors("python -m flows.x")
        def main(argv=None):
            raise exc

        return main

    assert failing(ContextualBertError("params.yaml: 'train.bogus': Extra inputs are not permitted"))() == 2
    assert (
        capsys.readouterr().err
        == "python -m flows.x: error: params.yaml: 'train.bogus': Extra inputs are not permitted\n"
    )
    output = (
        "Running stage 'features':\n> contextual-bert features\ncontextual-bert features: error: a split is empty\n"
    )
    assert failing(StageFailed(["dvc", "repro", "features"], 1, output))() == 2
    assert capsys.readouterr().err == "python -m flows.x: error: contextual-bert features: error: a split is empty\n"
    with pytest.raises(ZeroDivisionError):  # a fault, not a user error: the traceback stays
        failing(ZeroDivisionError("division by zero"))()


@pytest.mark.parametrize(
    "value, message",
    [
        ("train.lr", r"argument --set: 'train.lr': expected KEY=YAML"),
        ("train.seeds=[0", r"argument --set: 'train.seeds=\[0': the value is not valid YAML \(expected ',' or ']'"),
    ],
)
def test_a_bad_override_is_an_argparse_error_before_any_flow_runs(capsys, value, message):
    with pytest.raises(SystemExit) as exit_:
        pipeline_main(["--set", value])
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err.splitlines()[-1])


def test_a_stage_that_crashed_ends_in_a_short_block_naming_it(capsys):
    """Not a user error (a traceback, exit 1): the stage and the exception's line, never the traceback."""
    output = (
        "Running stage 'promote':\n> contextual-bert promote\nTraceback (most recent call last):\n"
        + "".join(f'  File "x.py", line {i}, in f\n' for i in range(30))
        + "RuntimeError: Tracer cannot infer type of (tensor([[3, 1]]), {})\n:Dictionary inputs must have entries\n"
        "ERROR: failed to reproduce 'promote': failed to run: contextual-bert promote, exited with 1\n"
    )

    @one_line_errors("python -m flows.x")
    def main(argv=None):
        raise RuntimeError("the flow failed") from StageFailed(["dvc", "repro", "promote"], 1, output)

    assert main() == 1
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [
        "python -m flows.x: stage 'promote' failed; the stages before it are done (dvc.lock)",
        "  error: RuntimeError: Tracer cannot infer type of (tensor([[3, 1]]), {})",
    ]
    assert len(err) <= 5 and not any("File " in line for line in err)
