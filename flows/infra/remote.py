"""Training units that share no disk with the parent: a fresh clone, a DVC remote, a report back.

The `remote` fan-out (flows/pipeline.py, `fan_out="remote"`) runs each unit (the train and evaluate
stages of one model and seed) where the parent's workspace cannot be seen, e.g. on another GPU box:

1. `parent_state` (parent): what a unit needs to see exactly what the parent sees, as values, never as
   paths: the git URL and the parent's commit (pushed), its params.yaml and dvc.lock as text (they hold
   this run's parameter overrides and the records of the stages that ran before the fan-out), and the
   DVC remote. Modified tracked files other than those two are refused: a clone could not see them.
2. `push_inputs` (parent): `dvc push` of the outputs the units depend on (e.g. data/features).
3. The unit, in a fresh clone at that commit (the deployment's `git_clone` pull step, or `clone_at`):
   `prepare_clone` writes params.yaml and dvc.lock; `pull_inputs` pulls only the unit's inputs;
   the stages run (`dvc repro --single-item`); `push_outputs` pushes the cached outputs and returns the
   report: the stages' dvc.lock records and the contents of their uncached outputs (small files such
   as reports/eval/<unit>.json, which `dvc push` does not carry).
4. `apply_report` (parent, in series with every other `dvc` command there): merges the records into
   dvc.lock, writes the uncached outputs, `dvc pull`s the cached ones, `dvc commit`s the stages and
   checks that the records it computes equal the unit's (for checkouts on the same disk, the parent writes
   the checkouts' records and `checkouts.refuse_stale` has DVC judge them once after the fan-out).

Nothing here imports Prefect: the flows (train_run.py, pipeline.py) carry the values between machines.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass
from pathlib import Path

from flows.infra.dvc_stages import git, read_lock, record_stages, run_dvc, same_record, stage_records

# The files a clone takes from the parent as text; every other tracked file must be committed.
CARRIED = ("params.yaml", "dvc.lock")
# A unit's uncached outputs travel in its report (through the Prefect API): small files only.
MAX_REPORT_BYTES = 4 * 1024 * 1024


class RemoteModeError(RuntimeError):
    """The parent's workspace cannot be handed to units that share no disk with it."""


@dataclass(frozen=True)
class ParentState:
    git_url: str
    commit: str
    params_yaml: str
    dvc_lock: str
    dvc_remote: str

    def as_parameters(self) -> dict:
        return asdict(self)


def default_dvc_remote(workdir: Path) -> str:
    """The DVC remote named by `core.remote` in the committed .dvc/config (a remote only in
    .dvc/config.local would be unknown to the clones)."""
    text = git(["show", "HEAD:.dvc/config"], workdir, check=False).strip()
    names = [line.split('"')[1] for line in text.splitlines() if line.strip().startswith("['remote \"")]
    default = next(
        (line.split("=", 1)[1].strip() for line in text.splitlines() if line.strip().startswith("remote =")), None
    )
    if default is None or default not in names:
        raise RemoteModeError(
            f"{workdir}/.dvc/config at HEAD names no default DVC remote: `dvc remote add -d storage <url>`, "
            "commit and push .dvc/config (credentials go to .dvc/config.local on each machine)"
        )
    return default


def parent_state(workdir: Path, git_remote: str = "origin", dvc_remote: str | None = None) -> ParentState:
    """What units need from the parent, as values. Raises `RemoteModeError` when a clone at the
    parent's commit could not see what the parent sees."""
    workdir = Path(workdir)
    commit = git(["rev-parse", "HEAD"], workdir, RemoteModeError).strip()
    url = git(["remote", "get-url", git_remote], workdir, check=False).strip()
    if not url:
        raise RemoteModeError(
            f"{workdir}: no git remote '{git_remote}' to clone from: `git remote add {git_remote} <url>`"
        )
    changed = [
        p for p in git(["diff", "--name-only", "HEAD"], workdir, RemoteModeError).splitlines() if p not in CARRIED
    ]
    # Outputs of stages (metrics kept in git, say) are DVC's to judge through dvc.lock; the rest is code.
    cached, uncached = _outs(workdir) if changed else (set(), set())
    modified = [p for p in changed if not _under(p, cached | uncached)]
    if modified:
        raise RemoteModeError(
            f"{workdir}: tracked files differ from commit {commit[:12]}: {modified[:10]}; units clone "
            f"the commit and take only {list(CARRIED)} from here: commit and push the rest"
        )
    # On the remote: a ref points at it, or at a descendant this repository knows.
    remote_shas = git(["ls-remote", url], workdir, check=False).strip().split()[0::2]
    on_remote = commit in remote_shas or any(
        subprocess.run(["git", "merge-base", "--is-ancestor", commit, sha], cwd=workdir, capture_output=True).returncode
        == 0
        for sha in remote_shas
    )
    if not on_remote:
        raise RemoteModeError(f"{workdir}: commit {commit[:12]} is not on {git_remote} ({url}): `git push` it first")
    lock = workdir / "dvc.lock"
    return ParentState(
        git_url=url,
        commit=commit,
        params_yaml=(workdir / "params.yaml").read_text(),
        dvc_lock=lock.read_text() if lock.exists() else "",
        dvc_remote=dvc_remote or default_dvc_remote(workdir),
    )


def _target(workdir: Path, stage: str) -> str:
    # Absolute: DVC resolves a bare stage name against the process's cwd, not the repository's.
    return f"{Path(workdir).resolve() / 'dvc.yaml'}:{stage}"


def _under(path: str, outs) -> bool:
    return any(path == o or path.startswith(o.rstrip("/") + "/") for o in outs)


def _outs(workdir: Path, but: AbstractSet[str] = frozenset()) -> tuple[set[str], set[str]]:
    """The (cached, uncached) output paths of every stage except those in `but`."""
    from dvc.repo import Repo

    with Repo(str(Path(workdir))) as repo:
        outs = [o for s in repo.index.stages if s.name not in but for o in s.outs]
    return {o.def_path for o in outs if o.use_cache}, {o.def_path for o in outs if not o.use_cache}


def unit_inputs(workdir: Path, stages: list[str] | tuple[str, ...]) -> list[str]:
    """The cached outputs of other stages that these stages depend on (files or whole directories,
    as the deps name them): what a unit pulls, and what the parent pushes first."""
    from dvc.repo import Repo

    workdir = Path(workdir)
    with Repo(str(workdir)) as repo:
        deps = {d.def_path for name in stages for s in repo.stage.collect(_target(workdir, name)) for d in s.deps}
    cached, uncached = _outs(workdir, set(stages))
    carried = sorted(d for d in deps if _under(d, uncached))
    if carried:
        raise RemoteModeError(
            f"{list(stages)} depend on {carried}, outputs DVC does not cache: a unit "
            "elsewhere cannot pull them (cache them in dvc.yaml)"
        )
    return sorted(d for d in deps if _under(d, cached))


def _uncached_outs(workdir: Path, stages: list[str] | tuple[str, ...]) -> list[str]:
    from dvc.repo import Repo

    workdir = Path(workdir)
    with Repo(str(workdir)) as repo:
        return [
            o.def_path
            for name in stages
            for s in repo.stage.collect(_target(workdir, name))
            for o in s.outs
            if not o.use_cache
        ]


def push_inputs(workdir: Path, units: list[tuple[str, ...]], dvc_remote: str) -> list[str]:
    """`dvc push` the outputs the units depend on, so clones can pull them. Returns the paths."""
    paths = sorted({p for unit in units for p in unit_inputs(workdir, unit)})
    if paths:
        run_dvc(["push", "-r", dvc_remote, *paths], Path(workdir))
    return paths


def clone_at(git_url: str, commit: str, dest: Path) -> Path:
    """A fresh clone of `git_url` at `commit` (what the deployment's git_clone pull step makes)."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise RemoteModeError(f"{dest}: not empty; a unit needs a fresh clone")
    dest.parent.mkdir(parents=True, exist_ok=True)
    git(["clone", "--quiet", "--no-checkout", git_url, str(dest)], dest.parent, RemoteModeError)
    git(["checkout", "--quiet", "--detach", commit], dest, RemoteModeError)
    return dest


def prepare_clone(clone: Path, state: ParentState) -> Path:
    """Check the clone is at the parent's commit; give it the parent's params.yaml and dvc.lock."""
    clone = Path(clone)
    head = git(["rev-parse", "HEAD"], clone, RemoteModeError).strip()
    if head != state.commit:
        raise RemoteModeError(f"{clone} is at {head[:12]}, not at the parent's commit {state.commit[:12]}")
    (clone / "params.yaml").write_text(state.params_yaml)
    if state.dvc_lock:
        (clone / "dvc.lock").write_text(state.dvc_lock)
    return clone


def pull_inputs(clone: Path, stages: list[str] | tuple[str, ...], dvc_remote: str) -> list[str]:
    """`dvc pull` only the unit's inputs from the remote. Returns the paths pulled."""
    paths = unit_inputs(clone, stages)
    if paths:
        run_dvc(["pull", "-r", dvc_remote, *paths], Path(clone))
    return paths


def push_outputs(clone: Path, stages: list[str] | tuple[str, ...], dvc_remote: str) -> dict:
    """`dvc push` the stages' cached outputs; return the report the parent applies."""
    clone = Path(clone)
    records = stage_records(clone, stages)
    run_dvc(["push", "-r", dvc_remote, *stages], clone)
    files: dict[str, str] = {}
    for out in _uncached_outs(clone, stages):
        path = clone / out
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file():
                files[f.relative_to(clone).as_posix()] = base64.b64encode(f.read_bytes()).decode()
    size = sum(len(v) for v in files.values())
    if size > MAX_REPORT_BYTES:
        raise RuntimeError(
            f"uncached outputs of {list(stages)} take {size} bytes, over {MAX_REPORT_BYTES}: "
            "cache them (DVC) so they travel through the remote"
        )
    return {
        "commit": git(["rev-parse", "HEAD"], clone, RemoteModeError).strip(),
        "stages": records,
        "files": files,
        "where": f"{socket.gethostname()}:{clone}",
        "pid": os.getpid(),
    }


def apply_report(workdir: Path, report: dict, dvc_remote: str) -> list[str]:
    """Bring a unit's results into the parent's workspace and record them (run in series).

    Raises when the unit ran at another commit, or when the records DVC computes here differ from the
    unit's (it saw other inputs than the parent has now)."""
    workdir = Path(workdir)
    head = git(["rev-parse", "HEAD"], workdir, RemoteModeError).strip()
    if report["commit"] != head:
        raise RuntimeError(f"the unit ran at commit {report['commit'][:12]}, this workspace is at {head[:12]}")
    stages = list(report["stages"])
    record_stages(workdir, report["stages"])
    for rel, data in report["files"].items():
        dst = workdir / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.unlink(missing_ok=True)
        dst.write_bytes(base64.b64decode(data))
    run_dvc(["pull", "--force", "-r", dvc_remote, *stages], workdir)
    run_dvc(["commit", "--force", *stages], workdir)
    mine = read_lock(workdir).get("stages", {})
    for stage in stages:
        if stage not in mine or not same_record(mine[stage], report["stages"][stage]):
            raise RuntimeError(
                f"{stage}: the record DVC computes in {workdir} differs from the one the unit wrote at "
                f"{report['where']}; the unit trained on other inputs"
            )
    return stages
