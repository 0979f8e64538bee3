"""Units that share no disk with the parent: a fresh clone at the parent's commit, inputs and outputs
through a DVC remote, a report back (flows/infra/remote.py). A toy DVC project, a bare git repository and a
local-directory DVC remote, all outside the workspace; no Prefect server."""

from __future__ import annotations

import json
import shutil

import pytest
from flows_testkit import dvc, git, make_toy_repo, run

from flows.infra import dvc_stages, remote
from flows.infra.remote import RemoteModeError

UNIT = ("train@none-0", "evaluate@none-0")


@pytest.fixture
def shared(tmp_path):
    """A toy project with a git origin (bare) and a default DVC remote (a directory), pushed."""
    origin, storage = tmp_path / "origin.git", tmp_path / "dvc-storage"
    run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], tmp_path)
    repo = make_toy_repo(tmp_path / "parent")
    dvc(["remote", "add", "-d", "storage", str(storage)], repo)
    git(["add", ".dvc/config"], repo)
    git(["commit", "-q", "-m", "a DVC remote"], repo)
    git(["remote", "add", "origin", str(origin)], repo)
    git(["push", "-q", "origin", "main"], repo)
    return repo


def test_a_unit_in_a_fresh_clone_gets_only_values_and_its_inputs(shared, tmp_path):
    parent = shared
    # This run's parameters (uncommitted) and an upstream stage run here: both reach the unit as text.
    (parent / "params.yaml").write_text((parent / "params.yaml").read_text().replace("10", "7"))
    dvc_stages.repro("prep", parent)

    state = remote.parent_state(parent)
    assert state.dvc_remote == "storage" and state.commit == git(["rev-parse", "HEAD"], parent).strip()
    assert str(parent) not in json.dumps(state.as_parameters())  # values, never a path of the parent
    assert remote.push_inputs(parent, [UNIT], state.dvc_remote) == ["data/features"]

    clone = remote.clone_at(state.git_url, state.commit, tmp_path / "elsewhere" / "clone")
    remote.prepare_clone(clone, state)
    assert remote.pull_inputs(clone, UNIT, state.dvc_remote) == ["data/features"]
    assert (clone / "data/features/x.txt").read_text() == "buckets=7"
    assert not (clone / "models").exists()  # only the unit's inputs were pulled
    for stage in UNIT:
        assert f"Running stage '{stage}'" in dvc_stages.repro(stage, clone)
    report = remote.push_outputs(clone, UNIT, state.dvc_remote)
    assert set(report["stages"]) == set(UNIT) and list(report["files"]) == ["reports/eval/none-s0.json"]
    shutil.rmtree(clone)  # the unit's disk is gone: what comes back comes through the remote and report

    assert remote.apply_report(parent, report, state.dvc_remote) == list(UNIT)
    assert dvc_stages.stale(list(UNIT), parent) == {}
    ckpt = json.loads((parent / "models/none-s0/ckpt.json").read_text())
    assert ckpt["cwd"] == str(clone) and ckpt["features"] == "buckets=7"
    assert json.loads((parent / "reports/eval/none-s0.json").read_text()) == {"model": "none", "score": 1}
    left = dvc_stages.status_all(parent)
    assert not set(UNIT) & set(left) and "train@concat-0" in left


def test_a_report_made_from_other_inputs_is_refused(shared, tmp_path):
    parent = shared
    dvc_stages.repro("prep", parent)
    state = remote.parent_state(parent)
    remote.push_inputs(parent, [UNIT], state.dvc_remote)
    clone = remote.prepare_clone(remote.clone_at(state.git_url, state.commit, tmp_path / "clone"), state)
    remote.pull_inputs(clone, UNIT, state.dvc_remote)
    for stage in UNIT:
        dvc_stages.repro(stage, clone)
    report = remote.push_outputs(clone, UNIT, state.dvc_remote)
    # Meanwhile the parent's features changed: the unit's records no longer match what DVC finds here.
    (parent / "params.yaml").write_text((parent / "params.yaml").read_text().replace("10", "3"))
    dvc_stages.repro("prep", parent)
    with pytest.raises(RuntimeError, match="differs.*trained on other inputs"):
        remote.apply_report(parent, report, state.dvc_remote)
    with pytest.raises(RuntimeError, match="ran at commit"):
        remote.apply_report(parent, {**report, "commit": "0" * 40}, state.dvc_remote)


def test_what_a_clone_could_not_see_is_refused_with_the_fix(shared, tmp_path):
    parent = shared
    (parent / "toy_stage.py").write_text((parent / "toy_stage.py").read_text() + "\n# edited\n")
    with pytest.raises(RemoteModeError, match=r"\['toy_stage.py'\].*commit and push"):
        remote.parent_state(parent)
    git(["commit", "-q", "-am", "not pushed"], parent)
    with pytest.raises(RemoteModeError, match="is not on origin.*git push"):
        remote.parent_state(parent)
    with pytest.raises(RemoteModeError, match="no git remote 'upstream'"):
        remote.parent_state(parent, git_remote="upstream")

    bare = make_toy_repo(tmp_path / "no-dvc-remote")
    git(["remote", "add", "origin", str(tmp_path / "origin.git")], bare)
    with pytest.raises(RemoteModeError, match="no default DVC remote"):
        remote.default_dvc_remote(bare)
    with pytest.raises(RemoteModeError, match="not at the parent's commit"):
        remote.prepare_clone(parent, remote.ParentState("x", "0" * 40, "", "", "storage"))
