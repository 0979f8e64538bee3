"""Training fanned out through deployments to the `gpu` pool: a real server, `prefect deploy` from
prefect.yaml, a process worker on the gpu pool. GPUs are concurrency slots here, so the path is the same
on this CPU-only machine: each run gets its device as CUDA_VISIBLE_DEVICES from its job variables and
holds slot gpu-<i>, so no two trainings share a GPU at a time."""

from __future__ import annotations

import json

import pytest
from flows_testkit import make_toy_repo, wait_until

from flows.infra import dvc_stages
from flows.infra.work_pools import ensure_pools, read_cluster
from flows.pipeline import pipeline

pytestmark = pytest.mark.slow


@pytest.fixture
def gpu_slots(prefect_api):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        ensure_pools(client, gpus=[0, 1], cpu_trainings=2)
    yield [0, 1]
    with get_client(sync_client=True) as client:
        ensure_pools(client, gpus=[], cpu_trainings=2)  # leave no GPU slot to later tests


def test_trainings_go_to_gpu_workers_one_per_gpu_at_a_time(prefect_api, gpu_slots, processes, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName, FlowRunFilter

    repo = make_toy_repo(tmp_path / "toy", with_flows=True, models=("none", "concat", "global_state"))
    server = prefect_api
    server.cli(["deploy", "--all"], repo)
    server.start_worker(processes, "gpu", repo, "gpu-worker-1", TOY_TRAIN_SECONDS="2")
    with get_client(sync_client=True) as client:
        wait_until(lambda: read_cluster(client).gpu_ready, 60, "gpu pool ready")

    result = pipeline(workdir=str(repo), fan_out="auto", max_parallel=3, train_timeout_s=240)

    assert len(result["trained"]) == 6 and result["stale"] == []
    runs = {
        u: json.loads((repo / "models" / f"{u}-s0" / "ckpt.json").read_text())
        for u in ("none", "concat", "global_state")
    }
    # Round robin over the GPUs, the device handed over in the run's environment.
    assert [runs[u]["cuda_visible_devices"] for u in ("none", "concat", "global_state")] == ["0", "1", "0"]
    on_gpu0 = sorted((r["start"], r["end"]) for r in runs.values() if r["cuda_visible_devices"] == "0")
    assert on_gpu0[0][1] <= on_gpu0[1][0], f"two trainings on GPU 0 at once: {on_gpu0}"
    assert all(r["cwd"].startswith(str(repo / ".dvc/tmp/checkouts/")) for r in runs.values())

    with get_client(sync_client=True) as client:
        flow_runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["train-run-gpu"])),
            flow_run_filter=FlowRunFilter(),
        )
    mine = [r for r in flow_runs if r.parameters.get("workdir") == str(repo)]
    assert len(mine) == 3 and all(r.state.is_completed() for r in mine)
    assert sorted(r.job_variables["env"]["CUDA_VISIBLE_DEVICES"] for r in mine) == ["0", "0", "1"]
    assert dvc_stages.status_all(repo) == {}
