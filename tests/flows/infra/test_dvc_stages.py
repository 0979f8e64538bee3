"""The stage plan the flows run, from dvc.yaml's DAG; the dvc command wrappers. No Prefect server."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from flows_testkit import REPO

from flows.infra import dvc_stages
from flows.infra.dvc_stages import Plan, StageFailed, plan

PIPELINE = (
    ["ingest", "validate", "features"]
    + [f"{kind}@{v}-{s}" for kind in ("train", "evaluate") for v in ("none", "global_state") for s in (0, 1)]
    + ["baseline", "report", "register", "promote"]
)


def pipeline_edges() -> list[tuple[str, str]]:
    edges = [("ingest", "validate"), ("validate", "features"), ("features", "baseline")]
    for v in ("none", "global_state"):
        for s in (0, 1):
            edges += [
                ("features", f"train@{v}-{s}"),
                (f"train@{v}-{s}", f"evaluate@{v}-{s}"),
                ("features", f"evaluate@{v}-{s}"),
                (f"evaluate@{v}-{s}", "report"),
                (f"train@{v}-{s}", "report"),
            ]
    edges += [("baseline", "report"), ("report", "register"), ("register", "promote")]
    return edges


def test_plan_runs_ancestors_first_then_one_unit_per_model_seed_then_the_rest():
    p = plan(PIPELINE, pipeline_edges())
    assert p.before == ("ingest", "validate", "features")
    assert p.units == (
        ("train@none-0", "evaluate@none-0"),
        ("train@none-1", "evaluate@none-1"),
        ("train@global_state-0", "evaluate@global_state-0"),
        ("train@global_state-1", "evaluate@global_state-1"),
    )
    # baseline needs only the features, but nothing in the fan-out needs it: it runs after.
    assert p.after == ("baseline", "report", "register", "promote")
    assert sorted(p.stages) == sorted(PIPELINE)


def test_plan_order_is_topological_even_when_dvc_yaml_lists_a_stage_early():
    stages = ["report", "ingest", "features", "train@a-0"]
    edges = [("ingest", "features"), ("features", "train@a-0"), ("train@a-0", "report")]
    assert plan(stages, edges) == Plan(before=("ingest", "features"), units=(("train@a-0",),), after=("report",))


def test_plan_refuses_a_unit_that_depends_on_another_units_stage():
    edges = [("train@a-0", "evaluate@b-0")]
    with pytest.raises(ValueError, match="evaluate@b-0 depends on another unit"):
        plan(["train@a-0", "train@b-0", "evaluate@b-0"], edges)


def test_plan_of_the_real_dvc_yaml():
    """The lead's dvc.yaml has the shape the flows expect: matrix stages named <kind>@<model>-<seed>."""
    if not (REPO / "dvc.yaml").exists():
        pytest.skip("no dvc.yaml yet")
    p = dvc_stages.load_plan(REPO)
    assert p.before[:4] == ("source", "ingest", "validate", "features")
    assert p.units, "no train@ stages"
    for unit in p.units:
        assert [dvc_stages.kind(s) for s in unit] == ["train", "evaluate"]
        assert len({dvc_stages.unit_key(s) for s in unit}) == 1
    assert "baseline" in p.after and "report" in p.after
    assert p.after.index("baseline") < p.after.index("report")


def test_kind_and_unit_key():
    assert dvc_stages.kind("train@none-0") == "train"
    assert dvc_stages.unit_key("evaluate@global_state_update-2") == "global_state_update-2"
    assert dvc_stages.kind("report") == dvc_stages.unit_key("report") == "report"


def test_a_user_error_is_told_apart_from_a_crash():
    user = StageFailed(
        ["dvc", "repro"],
        255,
        "Running stage 'validate':\n"
        "contextual-bert validate: error: data/raw/outfits.parquet: row 3, column items: empty\n",
    )
    crash = StageFailed(["dvc", "repro"], 255, "Traceback (most recent call last):\nConnectionError: refused\n")
    assert user.user_error and not crash.user_error
    assert "exited with 255" in str(user) and "row 3" in str(user)


def test_stage_env_runs_the_checkouts_code_with_the_venvs_tools(tmp_path):
    (tmp_path / "src").mkdir()
    env = dvc_stages.stage_env(tmp_path, {"CUDA_VISIBLE_DEVICES": "1"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "src")
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_run_dvc_raises_with_the_output_tail(tmp_path):
    with pytest.raises(StageFailed, match="not inside of a DVC repository|you are not inside"):
        dvc_stages.run_dvc(["status"], tmp_path)


def test_status_all_ignores_stages_that_are_only_always_changed(monkeypatch):
    out = '{"promote": ["always changed"], "report": [{"changed deps": {"reports/eval": "modified"}}]}\n'
    monkeypatch.setattr(dvc_stages, "run_dvc", lambda args, workdir: out)
    assert list(dvc_stages.status_all(REPO)) == ["report"]
    assert dvc_stages.stale(["promote", "report"], REPO) == {"report": [{"changed deps": {"reports/eval": "modified"}}]}
    assert dvc_stages.stale(["promote"], REPO) == {}  # what require_fresh asks: the source stage is not stale
