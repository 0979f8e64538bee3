"""Where trainings run: the `gpu` work pool when a GPU worker is up, the `cpu` pool otherwise.

- Pools `cpu` and `gpu` are Prefect work pools of type `process` here (Kubernetes or Docker pools
  elsewhere, see docs/scaling.md). A pool is READY while at least one of its workers sends heartbeats.
- GPUs are global concurrency limits `gpu-0`, `gpu-1`, ... of one slot each: a training on GPU i holds
  slot `gpu-i` for its whole run, so at most one training runs per GPU at a time, however many
  workers there are. On a `process` pool the device is handed to the run as `CUDA_VISIBLE_DEVICES=i`
  in the flow run's job variables (the worker puts them in the run's environment); on a Kubernetes or
  Docker pool the device plugin picks the GPU and the slots only cap how many trainings run at once.
- The gpu pool counts as up while it is READY; Prefect marks a worker offline only after three missed
  heartbeats (90 s by default), so runs sent just after the last GPU worker died wait for one.
- CPU trainings hold a slot of `train-cpu` (N slots: N trainings at once on the CPU workers) and run
  with `CUDA_VISIBLE_DEVICES=""`, so a CPU run on a GPU host leaves the GPUs to the gpu pool.

- A worker that dies (its machine gone, SIGKILL) reports nothing: its training stays `Running`. The
  trainings send heartbeats (`PREFECT_FLOWS_HEARTBEAT_FREQUENCY`, in their job variables), and the
  automation `crash-silent-trainings` marks a training (tag `train-run`) `Crashed` after
  `ZOMBIE_AFTER_S` without one (flow runs send one each 180 s by default: other runs are left alone); the
  pipeline then retries the unit once, on whichever worker is left.

Orchestration and trainings are separate classes of work in the `cpu` pool: the flows that only
drive others (the pipeline, training, promotion and sweep deployments) go to its work queue `pipeline`,
trainings to `default`. One worker on the pool (`make prefect-worker`) serves both queues; where
workers can die under a training (more machines, `make stack-up`), the training workers serve only
`default` (`--work-queue default`) and one worker of its own serves `pipeline`, so a worker lost with
its trainings never takes the parent flow with it: the parent sees the trainings crash and retries
them elsewhere. No pool concurrency limit on `cpu`: the pipeline flow itself runs there while it waits
for its trainings, and a pool limit would let it starve them.

Both pools' base job template is locked (`locked_job_template`): a flow run or deployment may set `env`
(placement, heartbeats), never `command` or `working_dir` (issue 90, finding 1; docs/security.md).

`python -m flows.infra.work_pools --gpus 0,1 --cpu-trainings 2` creates (or updates) all of it.
"""

from __future__ import annotations

import argparse
import copy
import re
from dataclasses import dataclass, field

CPU_POOL = "cpu"
GPU_POOL = "gpu"
# Work queues (prefect.yaml's work_queue_name): the flows that drive others vs the trainings.
PIPELINE_QUEUE, TRAIN_QUEUE = "pipeline", "default"
CPU_SLOT = "train-cpu"
GPU_SLOT = re.compile(r"^gpu-(\d+)$")
TRAIN_FLOW = "train-run"  # the name of flows.train_run.train_run
TRAIN_DEPLOYMENT = {CPU_POOL: "train-run-cpu", GPU_POOL: "train-run-gpu"}
TRAIN_REMOTE_FLOW = "train-run-remote"  # flows.train_run.train_run_remote: a fresh clone, a DVC remote
TRAIN_REMOTE_DEPLOYMENT = {CPU_POOL: "train-run-remote-cpu", GPU_POOL: "train-run-remote-gpu"}
# The run's environment variables its deployment's git_clone pull step reads (prefect.yaml).
CLONE_URL_ENV, CLONE_COMMIT_ENV = "CONTEXTUAL_BERT_GIT_URL", "CONTEXTUAL_BERT_COMMIT"
HEARTBEAT_S = 30  # the trainings' heartbeat period (Prefect's minimum)
# A training's slot is a lease its run renews; a run killed with its worker holds it until it lapses.
# The server's minimum (default 300 s): the slot is free again before the dead run is marked Crashed
# (ZOMBIE_AFTER_S), so its retry does not wait. Measured: with 300 s the retry waited 3.5 min for it.
TRAIN_SLOT_LEASE_S = 60
# A Prefect server whose database is briefly away answers 500: clients retry that too (5 times, 2 s to
# 32 s apart) instead of failing the run. In every deployment's environment (prefect.yaml) and so in
# every training's (the pipeline passes it on: a run's env replaces its deployment's).
RESILIENT_ENV = {"PREFECT_CLIENT_RETRY_EXTRA_CODES": "500"}
ZOMBIE_AFTER_S = 90  # no heartbeat for this long: the training's worker is gone
ZOMBIE_AUTOMATION = "crash-silent-trainings"
TRAIN_TAG = "train-run"  # every training flow run carries it; the zombie automation watches only those
# Job variables of Prefect's process template that would change what a run executes: not settable here.
LOCKED_VARIABLES = ("command", "working_dir")


@dataclass(frozen=True)
class Placement:
    """Where one training unit runs: pool, deployment, environment and the concurrency slot it holds."""

    pool: str
    deployment: str
    slot: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def job_variables(self) -> dict:
        return {"env": dict(self.env)}


def choose_pool(gpu_pool_ready: bool, gpu_devices: list[int]) -> str:
    """`gpu` when a GPU worker is up and GPU slots exist, else `cpu`."""
    return GPU_POOL if gpu_pool_ready and gpu_devices else CPU_POOL


def gpu_devices(limit_names: list[str]) -> list[int]:
    """The GPU indices declared as `gpu-<i>` concurrency limits, sorted."""
    return sorted(int(m.group(1)) for name in limit_names if (m := GPU_SLOT.match(name)))


def place(n_units: int, gpu_pool_ready: bool, devices: list[int], pin_devices: bool = True) -> list[Placement]:
    """One placement per unit: round robin over the GPUs (each guarded by its slot), or the CPU pool.

    pin_devices: hand GPU i to the run as CUDA_VISIBLE_DEVICES=i. Right for `process` pools, where
    every run sees all of its host's GPUs; wrong for Kubernetes or Docker pools, where the device plugin
    gives each container its own GPU (as device 0): there the slots only cap how many run at once.
    """
    pool = choose_pool(gpu_pool_ready, devices)
    if pool == CPU_POOL:
        return [
            Placement(CPU_POOL, TRAIN_DEPLOYMENT[CPU_POOL], CPU_SLOT, {"CUDA_VISIBLE_DEVICES": ""})
            for _ in range(n_units)
        ]
    return [
        Placement(
            GPU_POOL, TRAIN_DEPLOYMENT[GPU_POOL], f"gpu-{d}", {"CUDA_VISIBLE_DEVICES": str(d)} if pin_devices else {}
        )
        for d in (devices[i % len(devices)] for i in range(n_units))
    ]


def locked_job_template() -> dict:
    """Prefect's process-worker template without the variables in LOCKED_VARIABLES: the worker runs its
    own command (the flow's engine) in a directory of its choosing, and the server answers 422 to a flow
    run or deployment that sets one of them, or any variable the template does not know."""
    from prefect.workers.process import ProcessWorker

    template = copy.deepcopy(ProcessWorker.get_default_base_job_template())
    for name in LOCKED_VARIABLES:
        del template["variables"]["properties"][name]
        template["job_configuration"][name] = None
    template["variables"]["additionalProperties"] = False
    return template


# --- what the Prefect API says (needs a server) ---------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    gpu_ready: bool  # the gpu pool has a live worker (READY)
    devices: list[int]  # GPU indices with an active slot gpu-<i>
    pin_devices: bool  # the gpu pool is a `process` pool (see `place`)


def read_cluster(client) -> Cluster:
    """What a sync Prefect client says about the gpu pool and the GPU slots."""
    from prefect.client.schemas.objects import WorkPoolStatus
    from prefect.exceptions import ObjectNotFound

    try:
        pool = client.read_work_pool(GPU_POOL)
        ready, pin = pool.status == WorkPoolStatus.READY, pool.type == "process"
    except ObjectNotFound:
        ready, pin = False, True
    names = [gcl.name for gcl in client.read_global_concurrency_limits(limit=200) if gcl.active]
    return Cluster(ready, gpu_devices(names), pin)


def deployments_exist(client, pools: set[str], remote: bool = False) -> bool:
    from prefect.exceptions import ObjectNotFound

    flow, names = (TRAIN_REMOTE_FLOW, TRAIN_REMOTE_DEPLOYMENT) if remote else (TRAIN_FLOW, TRAIN_DEPLOYMENT)
    try:
        for pool in pools:
            client.read_deployment_by_name(f"{flow}/{names[pool]}")
    except ObjectNotFound:
        return False
    return True


def ensure_zombie_automation(client, after_s: float = ZOMBIE_AFTER_S) -> str:
    """The automation that marks a flow run `Crashed` when its heartbeats stop (Prefect's documented
    zombie detection): a training whose worker died is then retried instead of waited for."""
    from datetime import timedelta

    from prefect.automations import AutomationCore
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    wanted = AutomationCore(
        name=ZOMBIE_AUTOMATION,
        description=f"a flow run without a heartbeat for {after_s:.0f} s has lost its worker: Crashed",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            # Only trainings: every flow run sends a heartbeat (by default each 180 s), the pipeline's too.
            match_related=ResourceSpecification(
                {"prefect.resource.role": "tag", "prefect.resource.id": [f"prefect.tag.{TRAIN_TAG}"]}
            ),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=after_s),
        ),
        actions=[
            ChangeFlowRunState(state=StateType.CRASHED, message=f"no heartbeat for {after_s:.0f} s: its worker is gone")
        ],
    )
    existing = client.read_automations_by_name(ZOMBIE_AUTOMATION)
    if any(a.trigger == wanted.trigger and a.actions == wanted.actions for a in existing):
        return f"automation {ZOMBIE_AUTOMATION}: exists ({after_s:.0f} s)"
    for a in existing:
        client.delete_automation(a.id)
    client.create_automation(wanted)
    return f"automation {ZOMBIE_AUTOMATION}: {after_s:.0f} s"


def ensure_pools(client, gpus: list[int], cpu_trainings: int, zombie_after_s: float = ZOMBIE_AFTER_S) -> list[str]:
    """Create the `cpu` and `gpu` process pools and the slots; idempotent. Returns what it did."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate, WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    done = []
    template = locked_job_template()
    for pool in (CPU_POOL, GPU_POOL):
        try:
            existing = client.read_work_pool(pool)
        except ObjectNotFound:
            client.create_work_pool(
                WorkPoolCreate(
                    name=pool,
                    type="process",
                    base_job_template=template,
                    description=f"trainings on {pool.upper()} workers (contextual-bert)",
                )
            )
            done.append(f"pool {pool}: created")
            continue
        if existing.base_job_template != template:  # made before the lock, or changed since
            client.update_work_pool(pool, WorkPoolUpdate(base_job_template=template))
            done.append(f"pool {pool}: job template locked")
        else:
            done.append(f"pool {pool}: exists")
    try:
        client.read_work_queue_by_name(PIPELINE_QUEUE, work_pool_name=CPU_POOL)
    except ObjectNotFound:
        client.create_work_queue(
            PIPELINE_QUEUE,
            work_pool_name=CPU_POOL,
            description="flows that drive others (pipeline, training, promotion, sweep)",
        )
        done.append(f"queue {CPU_POOL}/{PIPELINE_QUEUE}: created")
    wanted = {CPU_SLOT: cpu_trainings, **{f"gpu-{g}": 1 for g in gpus}}
    for name, limit in wanted.items():
        client.upsert_global_concurrency_limit_by_name(name, limit)
        client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active=True))
        done.append(f"limit {name}: {limit}")
    for gcl in client.read_global_concurrency_limits(limit=200):
        if GPU_SLOT.match(gcl.name) and gcl.name not in wanted and gcl.active:
            # A GPU no longer listed: keep its history but stop placing runs on it.
            client.update_global_concurrency_limit(gcl.name, GlobalConcurrencyLimitUpdate(active=False))
            done.append(f"limit {gcl.name}: deactivated")
    done.append(ensure_zombie_automation(client, zombie_after_s))
    return done


def main(argv: list[str] | None = None) -> int:
    from prefect.client.orchestration import get_client

    parser = argparse.ArgumentParser(prog="python -m flows.infra.work_pools", description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="", help="GPU indices, e.g. '0,1' or '0 1' (default: none)")
    parser.add_argument("--cpu-trainings", type=int, default=2, help="trainings at once on the CPU pool")
    parser.add_argument(
        "--zombie-after",
        type=float,
        default=ZOMBIE_AFTER_S,
        help="seconds without a heartbeat before a training counts as crashed",
    )
    args = parser.parse_args(argv)
    gpus = [int(g) for g in re.split(r"[,\s]+", args.gpus.strip()) if g]
    with get_client(sync_client=True) as client:
        for line in ensure_pools(client, gpus, args.cpu_trainings, args.zombie_after):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
