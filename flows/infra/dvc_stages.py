"""DVC, the one judge of what is stale: the `dvc` (and `git`) commands the flows run, and the stage plan.

Nothing here imports Prefect, so it is tested without a server. Every stage runs as
`dvc repro --single-item <stage>`: DVC compares the stage's deps, params and outs with dvc.lock and
skips it when nothing changed, so no Prefect cache can ever skip work that DVC would run.

One DVC workspace takes one `dvc` command at a time (DVC holds `.dvc/tmp/lock`), so every call for a
workspace is made in series by the flow that owns it; parallel trainings get their own checkouts
(`flows/infra/checkouts.py`).
"""

from __future__ import annotations

import graphlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

# Stage kinds that run once per (model, seed) in their own flow run; everything else runs in series.
FANOUT_KINDS = ("train", "evaluate")
# Stages that talk to the MLflow server: their transient faults (server not up yet) are retried.
MLFLOW_STAGES = frozenset({"register", "promote"})

_EDGE = re.compile(r'"([^"]+)"\s*->\s*"([^"]+)"')
_NODE = re.compile(r'^"([^"]+)";$', re.MULTILINE)


class StageFailed(RuntimeError):
    """A `dvc` command failed. `user_error` is True when a stage printed a one-line user error
    (`contextual-bert <stage>: error: ...`, exit 2): bad data or params, which no retry can fix."""

    def __init__(self, command: list[str], returncode: int, output: str):
        self.command = command
        self.returncode = returncode
        self.output = output
        self.user_error = bool(re.search(r"^contextual-bert [\w-]+: error: ", output, re.MULTILINE))
        tail = "\n".join(output.strip().splitlines()[-15:])
        super().__init__(f"`{' '.join(command)}` exited with {returncode}:\n{tail}")


@dataclass(frozen=True)
class Plan:
    """The DVC stages in the order the flows run them.

    `before` and `after` run in series in the parent's workspace; each unit (the train and evaluate
    stages of one model and seed, e.g. `("train@none-0", "evaluate@none-0")`) runs in its own flow
    run and checkout.
    """

    before: tuple[str, ...]
    units: tuple[tuple[str, ...], ...]
    after: tuple[str, ...]

    @property
    def stages(self) -> tuple[str, ...]:
        return self.before + tuple(s for unit in self.units for s in unit) + self.after


def stage_env(workdir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a stage run from `workdir`.

    The venv's bin/ goes first on PATH (a worker started as `.venv/bin/prefect worker start` has no
    activated venv), and `workdir/src` first on PYTHONPATH, so the code a stage runs is the code DVC
    hashed for it, also in a checkout other than the one the venv was installed from.
    """
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    src = Path(workdir) / "src"
    if src.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def dvc_executable() -> str:
    beside = Path(sys.executable).parent / "dvc"
    return str(beside) if beside.exists() else "dvc"


def run_dvc(
    args: list[str],
    workdir: Path,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    log: Path | None = None,
) -> str:
    """Run `dvc <args>` in `workdir`; return its combined output, raise `StageFailed` on failure.

    With `log`, the output goes to that file instead (and "" is returned): for commands that leave
    detached children holding their stdout open (`dvc queue start`), which a pipe would wait on forever.
    """
    command = [dvc_executable(), *args]
    env = env if env is not None else stage_env(workdir)
    proc: subprocess.CompletedProcess
    if log is None:
        proc = subprocess.run(
            command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
        )
        output = proc.stdout
    else:
        with open(log, "w") as out:
            proc = subprocess.run(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
        output = Path(log).read_text()
    if proc.returncode != 0:
        raise StageFailed(["dvc", *args], proc.returncode, output)
    return output if log is None else ""


def git(args: list[str], cwd: Path, error: type[Exception] = RuntimeError, check: bool = True) -> str:
    """`git <args>` in `cwd`: its stdout, or (with `check`) `error` naming the command and git's message."""
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise error(f"`git {' '.join(args)}` in {cwd} failed: {proc.stderr.strip()}")
    return proc.stdout


def repro(stages: str | list[str] | tuple[str, ...], workdir: Path, env: dict[str, str] | None = None) -> str:
    """`dvc repro --single-item <stage>...`: runs each stage, in the order given, only if DVC finds it stale
    (a unit's stages in one `dvc` command: DVC's start and pipeline load are paid once)."""
    return run_dvc(["repro", "--single-item", *([stages] if isinstance(stages, str) else stages)], workdir, env)


def stage_graph(workdir: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """The stages of dvc.yaml in its order, and the (upstream, downstream) pairs of its DAG."""
    dot = run_dvc(["dag", "--dot"], workdir)
    return _NODE.findall(dot), _EDGE.findall(dot)


def kind(stage: str) -> str:
    """`train@none-0` -> `train`; `report` -> `report`."""
    return stage.split("@", 1)[0]


def unit_key(stage: str) -> str:
    """`train@none-0` -> `none-0`: what groups a model-seed's train and evaluate stages."""
    return stage.split("@", 1)[1] if "@" in stage else stage


def plan(stages: list[str], edges: list[tuple[str, str]]) -> Plan:
    """Split the DAG into the series part before the fan-out, the fan-out units, and the rest.

    `before` holds every ancestor of a fan-out stage, `after` the others; both in a topological order
    that keeps dvc.yaml's order where the DAG allows it.
    """
    order = {s: i for i, s in enumerate(stages)}
    parents: dict[str, set[str]] = {s: set() for s in stages}
    for up, down in edges:
        parents.setdefault(down, set()).add(up)
        parents.setdefault(up, set())
    sorter = graphlib.TopologicalSorter(parents)
    sorter.prepare()
    topo: list[str] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=lambda s: order.get(s, len(order)))
        topo.extend(ready)
        sorter.done(*ready)

    fanout = [s for s in topo if kind(s) in FANOUT_KINDS]
    ancestors: set[str] = set()
    stack = [p for s in fanout for p in parents[s]]
    while stack:
        s = stack.pop()
        if s not in ancestors:
            ancestors.add(s)
            stack.extend(parents[s])
    before = tuple(s for s in topo if s in ancestors and s not in fanout)
    after = tuple(s for s in topo if s not in ancestors and s not in fanout)

    units: dict[str, list[str]] = {}
    for s in sorted(fanout, key=lambda s: (FANOUT_KINDS.index(kind(s)), order.get(s, 0))):
        units.setdefault(unit_key(s), []).append(s)
    for members in units.values():
        inside = set(members)
        for s in members:
            if parents[s] & set(fanout) - inside:
                raise ValueError(f"dvc.yaml: fan-out stage {s} depends on another unit's stage")
    return Plan(before=before, units=tuple(tuple(m) for m in units.values()), after=after)


def load_plan(workdir: Path) -> Plan:
    return plan(*stage_graph(workdir))


def stale(stages: list[str] | tuple[str, ...], workdir: Path) -> dict[str, list]:
    """`dvc status` of just these stages: {stage: [changes]} for the stale ones, {} when all are fresh.

    One `dvc status` of the whole pipeline, filtered: naming the stages costs DVC a collection per target,
    and for make repro's 84 training stages that took 50 s of CPU against 3 s for all of them at once."""
    if not stages:
        return {}
    wanted = set(stages)
    return {s: c for s, c in status_all(workdir).items() if s in wanted}


def status_all(workdir: Path) -> dict[str, list]:
    """`dvc status` of the whole pipeline, less stages marked `always_changed` that changed in no other
    way (`source`: it runs on every repro, and what it finds shows in the stages after it): {} when `dvc repro`
    would redo no work."""
    out = run_dvc(["status", "--json"], workdir)
    changes = json.loads(out.strip().splitlines()[-1] or "{}")
    return {stage: c for stage, c in changes.items() if c != ["always changed"]}


# libyaml when PyYAML has it: make repro's dvc.lock (~270 KB) parses in 0.04 s instead of 0.34 s.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def read_lock(workdir: Path) -> dict:
    """The workspace's dvc.lock, parsed ({} when there is none)."""
    lock = Path(workdir) / "dvc.lock"
    return (yaml.load(lock.read_text(), Loader=_LOADER) or {}) if lock.exists() else {}


def write_lock(workdir: Path, lock: dict) -> None:
    """Replace the workspace's dvc.lock at once (a reader never sees half of it); DVC reads any YAML."""
    path = Path(workdir) / "dvc.lock"
    partial = path.with_name(path.name + ".partial")
    partial.write_text(yaml.dump(lock, Dumper=_DUMPER, sort_keys=False))
    os.replace(partial, path)


def record_stages(workdir: Path, records: dict[str, dict]) -> None:
    """Write stages' dvc.lock entries, as DVC wrote them elsewhere, into the workspace's dvc.lock."""
    lock = read_lock(workdir) or {"schema": "2.0"}
    lock.setdefault("stages", {}).update(records)
    write_lock(workdir, lock)


def stage_records(workdir: Path, stages) -> dict[str, dict]:
    """The stages' dvc.lock entries (dvc.lock read once); raises if one has none: that stage did not run."""
    recorded = read_lock(workdir).get("stages", {})
    for stage in stages:
        if stage not in recorded:
            raise RuntimeError(f"{workdir}: stage {stage} has no record in dvc.lock; it did not run")
    return {stage: recorded[stage] for stage in stages}


def same_record(a: dict, b: dict) -> bool:
    """Two dvc.lock entries of a stage agree on what it ran (command, deps, params) and produced."""
    keep = ("cmd", "deps", "params", "outs")
    return {k: a.get(k) for k in keep} == {k: b.get(k) for k in keep}


def keep_lock_entries(workdir: Path, stages) -> None:
    """Cut the workspace's dvc.lock down to the entries of `stages` and of every stage outside the
    fan-out (the upstream ones among them).

    For a training checkout: DVC parses dvc.lock about ten times per command and rewrites it after each
    stage, and make repro's holds 84 training stages; a checkout needs only its own unit's and those
    upstream (1-1.8 s less per `dvc` command there, docs/training.md). The parent's dvc.lock is untouched.
    """
    lock = read_lock(workdir)
    if not lock:
        return
    wanted = set(stages)
    lock["stages"] = {
        name: entry
        for name, entry in lock.get("stages", {}).items()
        if name in wanted or kind(name) not in FANOUT_KINDS
    }
    write_lock(workdir, lock)


def cache_dir(workdir: Path) -> Path:
    """The workspace's DVC cache (`cache.dir`, default `.dvc/cache`), absolute."""
    return Path(run_dvc(["cache", "dir"], workdir).strip().splitlines()[-1]).resolve()
