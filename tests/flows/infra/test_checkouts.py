"""Own checkouts sharing one DVC cache, and bringing their outputs back so DVC won't redo them.

A toy DVC project of the pipeline's shape (tests/flows/flows_testkit.py); no Prefect server.
"""

from __future__ import annotations

import json

import pytest
from flows_testkit import git

from flows.infra import checkouts, dvc_stages

UNIT = ("train@none-0", "evaluate@none-0")


def test_a_checkout_sees_the_parents_uncommitted_work_and_shares_its_cache(toy_repo, tmp_path):
    (toy_repo / "params.yaml").write_text((toy_repo / "params.yaml").read_text().replace("10", "7"))
    (toy_repo / "notes.txt").write_text("untracked, not ignored")
    (toy_repo / "toy_stage.py").rename(toy_repo / "gone.py")  # a tracked file deleted (and one added)
    checkout = checkouts.create_checkout(toy_repo, tmp_path / "co")
    assert (checkout / "params.yaml").read_text() == (toy_repo / "params.yaml").read_text()
    assert (checkout / "notes.txt").read_text() == "untracked, not ignored"
    assert not (checkout / "toy_stage.py").exists() and (checkout / "gone.py").exists()
    assert dvc_stages.cache_dir(checkout) == dvc_stages.cache_dir(toy_repo) == (toy_repo / ".dvc/cache").resolve()
    assert str(checkout) in git(["worktree", "list"], toy_repo)

    checkouts.remove_checkout(toy_repo, checkout)
    assert not checkout.exists() and str(checkout) not in git(["worktree", "list"], toy_repo)


def test_a_unit_trained_in_a_checkout_is_up_to_date_in_the_parent(toy_repo, tmp_path):
    dvc_stages.repro(["prep", "train@concat-0"], toy_repo)  # the parent's dvc.lock holds another unit too
    checkout = checkouts.create_checkout(toy_repo, tmp_path / "co")
    checkouts.checkout_inputs(checkout, UNIT)
    assert (checkout / "data/features/x.txt").read_text() == "buckets=10"  # linked from the shared cache
    assert set(dvc_stages.read_lock(checkout)["stages"]) == {"prep"}  # upstream kept, the other unit not
    output = dvc_stages.repro(UNIT, checkout)  # one `dvc` command, the stages in the unit's order
    assert output.index("Running stage 'train@none-0'") < output.index("Running stage 'evaluate@none-0'")
    assert set(dvc_stages.read_lock(checkout)["stages"]) == {"prep", *UNIT}
    assert dvc_stages.stale(list(UNIT), toy_repo)  # the parent has not seen it yet

    assert checkouts.bring_back(checkout, toy_repo, UNIT) == list(UNIT)
    assert dvc_stages.stale(list(UNIT), toy_repo) == {}
    checkouts.refuse_stale(toy_repo, UNIT)  # nothing to refuse
    assert (
        dvc_stages.read_lock(toy_repo)["stages"]["train@none-0"]
        == dvc_stages.read_lock(checkout)["stages"]["train@none-0"]
    )  # the checkout's record, as DVC wrote it there
    ckpt = json.loads((toy_repo / "models/none-s0/ckpt.json").read_text())
    assert ckpt["cwd"] == str(checkout)  # trained there, not here
    assert (toy_repo / "reports/eval/none-s0.json").exists()  # an uncached output came back too
    left = dvc_stages.status_all(toy_repo)  # what `dvc repro` would still run
    assert "train@none-0" not in left and "evaluate@none-0" not in left
    assert "train@concat-0" not in left  # the parent's own record survived the bring-back
    assert "evaluate@concat-0" in left  # the rest of the other unit is still to do


def test_outputs_made_from_other_inputs_are_stale_in_the_parent_and_refused(toy_repo, tmp_path):
    dvc_stages.repro("prep", toy_repo)
    checkout = checkouts.create_checkout(toy_repo, tmp_path / "co")
    checkouts.checkout_inputs(checkout, UNIT[:1])
    dvc_stages.repro(UNIT[0], checkout)
    # Meanwhile the parent's features changed.
    (toy_repo / "params.yaml").write_text((toy_repo / "params.yaml").read_text().replace("10", "11"))
    dvc_stages.repro("prep", toy_repo)
    checkouts.bring_back(checkout, toy_repo, UNIT[:1])
    assert "train@none-0" in dvc_stages.stale(list(UNIT[:1]), toy_repo)  # never recorded as up to date
    with pytest.raises(RuntimeError, match=r"\['train@none-0'\]: .*made from other inputs"):
        checkouts.refuse_stale(toy_repo, UNIT[:1])


def test_bringing_back_a_stage_that_did_not_run_fails_clearly(toy_repo, tmp_path):
    checkout = checkouts.create_checkout(toy_repo, tmp_path / "co")
    with pytest.raises(RuntimeError, match="train@none-0 has no record in dvc.lock"):
        checkouts.bring_back(checkout, toy_repo, UNIT[:1])
