"""The flows against a real Prefect server, trainings fanned out in this process (no workers): DVC
decides what runs, each training works in its own checkout, a second run does nothing."""

from __future__ import annotations

import json

import pytest

from flows.infra import dvc_stages
from flows.infra.params_file import apply_overrides
from flows.infra.work_pools import CPU_SLOT, Cluster, ensure_pools, read_cluster
from flows.pipeline import pipeline, promotion, tracking_uri, training


def test_pipeline_runs_what_dvc_finds_stale_and_nothing_twice(prefect_api, toy_repo):
    first = pipeline(workdir=str(toy_repo), fan_out="local", max_parallel=2)
    assert first["ran"] == ["prep", "report", "register", "promote"]
    assert sorted(first["trained"]) == ["evaluate@concat-0", "evaluate@none-0", "train@concat-0", "train@none-0"]
    assert first["stale"] == []
    for unit in ("none-s0", "concat-s0"):
        ckpt = json.loads((toy_repo / "models" / unit / "ckpt.json").read_text())
        assert ckpt["cwd"].startswith(str(toy_repo / ".dvc/tmp/checkouts/"))  # trained in its own checkout
        assert ckpt["mlflow_tracking_uri"] == tracking_uri(toy_repo)  # ... logging to the parent's store
    assert not list((toy_repo / ".dvc/tmp/checkouts").iterdir())  # checkouts removed once brought back

    # A new model for one run (a parameter of the run): only its unit trains, nothing upstream runs again; the
    # run's params are its own, so params.yaml is as it was (the next run, the nightly, runs what it says).
    params_before = (toy_repo / "params.yaml").read_bytes()
    three = ["none", "concat", "global_state"]
    more = pipeline(workdir=str(toy_repo), fan_out="local", params={"train.models": three})
    assert more["params_changed"] == {"train.models": three}
    assert sorted(more["trained"]) == ["evaluate@global_state-0", "train@global_state-0"]
    assert more["ran"] == ["report", "register", "promote"] and more["stale"] == []
    assert (toy_repo / "params.yaml").read_bytes() == params_before
    # Kept by writing it into params.yaml: DVC recorded that run, so nothing is stale
    apply_overrides(toy_repo / "params.yaml", {"train.models": three})
    assert dvc_stages.status_all(toy_repo) == {}

    again = pipeline(workdir=str(toy_repo), fan_out="local")
    assert (again["ran"], again["trained"], again["stale"]) == ([], [], [])

    # The promotion flow runs the register and promote stages: DVC finds nothing new to register.
    assert promotion(workdir=str(toy_repo)) == {"ran": []}
    (toy_repo / "reports/register.txt").unlink()
    # register runs again; it writes what it wrote before, so promote's input is unchanged: DVC skips it.
    assert promotion(workdir=str(toy_repo)) == {"ran": ["register"]}


def test_training_only_refuses_stale_features(prefect_api, toy_repo):
    with pytest.raises(RuntimeError, match=r"stale upstream stages \['prep'\]"):
        training(workdir=str(toy_repo), fan_out="local")
    assert not (toy_repo / "models").exists()


def test_pools_and_slots_are_created_once_and_read_back(prefect_api):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        try:
            first = ensure_pools(client, gpus=[0, 1], cpu_trainings=2)
            assert "pool cpu: created" in first and "pool gpu: created" in first
            assert "automation crash-silent-trainings: 90 s" in first
            again = ensure_pools(client, gpus=[0, 1], cpu_trainings=2)
            assert "pool cpu: exists" in again and "limit gpu-1: 1" in again
            assert "automation crash-silent-trainings: exists (90 s)" in again
            assert len(client.read_automations_by_name("crash-silent-trainings")) == 1
            assert client.read_global_concurrency_limit_by_name(CPU_SLOT).limit == 2
            # No GPU worker: the gpu pool is not ready.
            assert read_cluster(client) == Cluster(gpu_ready=False, devices=[0, 1], pin_devices=True)
            assert "limit gpu-1: deactivated" in ensure_pools(client, gpus=[0], cpu_trainings=2)
            assert read_cluster(client).devices == [0]
        finally:
            ensure_pools(client, gpus=[], cpu_trainings=2)  # leave no GPU slot to later tests


def test_the_next_unit_starts_before_a_finished_one_is_brought_back(prefect_api, toy_repo, monkeypatch):
    # One core: when a unit ends, the next one's checkout is made and it is sent off before the parent
    # copies back and commits the finished one, so the core is not idle for the bring-back.
    import flows.pipeline

    checkouts = toy_repo / flows.pipeline.CHECKOUTS
    bring_back = flows.pipeline.bring_back.fn  # the task's function
    seen = []

    def bring_back_spy(key, checkout, workdir, stages):
        seen.append((key, sorted(p.name for p in checkouts.iterdir())))
        return bring_back(key, checkout, workdir, stages)

    monkeypatch.setattr(flows.pipeline, "bring_back", bring_back_spy)
    result = pipeline(workdir=str(toy_repo), fan_out="local", max_parallel=1)
    assert seen == [("none-0", ["concat-0", "none-0"]), ("concat-0", ["concat-0"])]
    assert sorted(result["trained"]) == ["evaluate@concat-0", "evaluate@none-0", "train@concat-0", "train@none-0"]
    assert result["stale"] == [] and not list(checkouts.iterdir())
