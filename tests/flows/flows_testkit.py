"""Helpers of the flow tests: processes in their own groups, a Prefect server handle, toy DVC projects.

Every process a test starts runs in its own process group and is ended by a finalizer, also when the
test fails: SIGTERM to the group, a bounded wait, then SIGKILL (a Prefect worker can take 15 s or more
to exit after SIGTERM, so the wait is short and SIGKILL does the rest). Every wait is bounded.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `import flows` (a top-level folder, not an installed package)
    sys.path.insert(0, str(REPO))

from flows.infra.net import free_port  # noqa: E402,F401 - the tests' one free-port helper

VENV_BIN = Path(sys.executable).parent
SERVER_START_TIMEOUT = 90


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def run(cmd: list[str], cwd: Path, env: dict | None = None, timeout: float = 120, check: bool = True) -> str:
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    return proc.stdout


@dataclass
class Proc:
    """A background process in its own process group, its output in a log file."""

    name: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, grace: float = 10) -> None:
        # A process worker starts its flow runs in sessions of their own, out of reach of its group:
        # noted now (they are re-parented once the worker is gone) and killed after it, unless they ended.
        descendants = {p: cmdline(p) for p in children(self.popen.pid)}
        try:
            self._stop_group(grace)
        finally:
            for pid, command in descendants.items():
                if cmdline(pid) == command:  # still that process, not a pid reused since
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def _stop_group(self, grace: float) -> None:
        pgid = self.popen.pid  # start_new_session: the group id is the leader's pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.popen.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            # The leader is gone; children of the group (flow runs of a worker) may not be.
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break


@dataclass
class Processes:
    """Starts background processes and ends every one of them (newest first) at teardown."""

    logs: Path
    started: list[Proc] = field(default_factory=list)

    def start(self, name: str, cmd: list[str], cwd: Path, env: dict) -> Proc:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        while self.started:
            self.started.pop().stop()


def children(pid: int) -> list[int]:
    """Every descendant of `pid` (from /proc), in no particular order."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        frontier += kids
    return found


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_tree(pid: int) -> list[int]:
    """SIGKILL a process and all its descendants at once, as if its machine died. Returns the pids."""
    victims = [pid, *children(pid)]
    for p in victims:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without Prefect/MLflow settings of the caller; the venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    env.update(extra)
    return env


@dataclass
class PrefectServer:
    url: str  # the API, http://127.0.0.1:<port>/api
    home: Path
    processes: Processes
    client_env: dict = field(default_factory=dict)  # e.g. PREFECT_API_AUTH_STRING, for every client

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(
            PREFECT_API_URL=self.url,
            PREFECT_HOME=str(self.home),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_WORKER_QUERY_SECONDS="2",
            PREFECT_WORKER_PREFETCH_SECONDS="2",
            PREFECT_LOGGING_LEVEL="INFO",
            **{**self.client_env, **extra},
        )

    def cli(self, args: list[str], cwd: Path, timeout: float = 120) -> str:
        return run([str(VENV_BIN / "prefect"), "--no-prompt", *args], cwd, self.env(), timeout)

    def start_worker(
        self, processes: Processes, pool: str, cwd: Path, name: str, queue: str | None = None, **env: str
    ) -> Proc:
        """A process worker on `pool`, on its work queue `queue` only when given (in `processes`, so the
        test that started it ends it)."""
        worker = processes.start(
            f"worker-{name}",
            [
                str(VENV_BIN / "prefect"),
                "worker",
                "start",
                "--pool",
                pool,
                "--name",
                name,
                "--type",
                "process",
                *(["--work-queue", queue] if queue else []),
            ],
            cwd,
            self.env(**env),
        )
        wait_until(lambda: "started" in worker.tail().lower() or not worker.alive(), 180, f"worker {name}")
        assert worker.alive(), worker.tail()
        return worker


# --- a toy DVC project with the pipeline's shape, seconds per stage -------------------------------

TOY_STAGE = '''\
"""Stand-ins for `contextual-bert <stage>`: what they read, the environment they saw, when they ran."""
import json, os, sys, time
from pathlib import Path

import yaml

kind, args = sys.argv[1], sys.argv[2:]
if os.environ.get("TOY_FAIL") == kind:  # a stage that crashes, as a fault in real code does
    raise RuntimeError(f"toy {kind} failed on purpose:\\n" + "\\n".join(f"  detail {i}" for i in range(40)))
if kind == "prep":
    buckets = yaml.safe_load(Path("params.yaml").read_text())["features"]["numeric_buckets"]
    Path("data/features").mkdir(parents=True, exist_ok=True)
    Path("data/features/x.txt").write_text(f"buckets={buckets}")
elif kind == "train":
    model, seed = args
    start = time.time()
    time.sleep(float(os.environ.get("TOY_TRAIN_SECONDS", "0.5")))
    out = Path(f"models/{model}-s{seed}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "ckpt.json").write_text(json.dumps({
        "features": Path("data/features/x.txt").read_text(), "model": model, "seed": int(seed),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "mlflow_tracking_uri": os.environ.get("MLFLOW_TRACKING_URI"),
        "cwd": os.getcwd(), "start": start, "end": time.time(),
    }))
elif kind == "evaluate":
    model, seed = args
    ckpt = json.loads(Path(f"models/{model}-s{seed}/ckpt.json").read_text())
    Path("reports/eval").mkdir(parents=True, exist_ok=True)
    Path(f"reports/eval/{model}-s{seed}.json").write_text(json.dumps({"model": ckpt["model"], "score": 1}))
elif kind == "report":
    names = sorted(p.name for p in Path("reports/eval").glob("*.json"))
    Path("reports/table.txt").write_text("\\n".join(names))
    Path("reports/table1.md").write_text("| Model |\\n")
elif kind in ("register", "promote"):
    Path(f"reports/{kind}.txt").write_text(Path("reports/table.txt").read_text())
'''

TOY_DVC_YAML = textwrap.dedent("""\
    stages:
      prep:
        cmd: python toy_stage.py prep
        deps: [toy_stage.py]
        params: [features.numeric_buckets]
        outs: [data/features]
      train:
        matrix:
          model: ${train.models}
          seed: ${train.seeds}
        cmd: python toy_stage.py train ${item.model} ${item.seed}
        deps: [data/features]
        outs:
          - models/${item.model}-s${item.seed}
      evaluate:
        matrix:
          model: ${train.models}
          seed: ${train.seeds}
        cmd: python toy_stage.py evaluate ${item.model} ${item.seed}
        deps:
          - models/${item.model}-s${item.seed}
        outs:
          - reports/eval/${item.model}-s${item.seed}.json:
              cache: false
      report:
        cmd: python toy_stage.py report
        deps: [reports/eval]
        outs:
          - reports/table.txt:
              cache: false
          - reports/table1.md:
              cache: false
      register:
        cmd: python toy_stage.py register
        deps: [reports/table.txt]
        outs:
          - reports/register.txt:
              cache: false
      promote:
        cmd: python toy_stage.py promote
        deps: [reports/register.txt]
        outs:
          - reports/promote.txt:
              cache: false
    """)

TOY_PARAMS = textwrap.dedent("""\
    # A toy project: a valid contextual-bert params.yaml, stand-in stages (toy_stage.py).
    features:
      numeric_buckets: 10   # prep's one param
    train:
      models: [none, concat]
      seeds: [0]
    """)


# The real pipeline at its smallest: seconds per training, for the end-to-end tests.
TINY_MODELS = ["none", "global_state"]
TINY_PARAMS = {
    "train.models": TINY_MODELS,
    "train.seeds": [0],
    "train.max_epochs": 12,  # enough to count better than popularity: promotion refuses a model that does not
    "train.batch_size": 128,
    "train.lr_warmup_steps": 10,
    "model.d_model": 32,
    "model.n_blocks": 2,
    "model.n_heads": 4,
    "model.d_ff": 64,
    "features.default_dim": 8,
    "features.embedding_dims": {},
}
# A nightly run's parameters in the end-to-end tests: `size: tiny` and TINY_PARAMS.
TINY_RUN = {"generate.size": "tiny", **TINY_PARAMS}


def params_as_run(workdir: Path, overrides: dict = TINY_RUN) -> str:
    """params.yaml as a run with these overrides had it (the run restores the file when it ends)."""
    from flows.infra.params_file import apply_overrides

    scratch = Path(workdir) / ".dvc" / "tmp" / "params-as-run.yaml"
    scratch.parent.mkdir(parents=True, exist_ok=True)
    scratch.write_text((Path(workdir) / "params.yaml").read_text())
    apply_overrides(scratch, overrides)
    text = scratch.read_text()
    scratch.unlink()
    return text


def check_one_off_run(workdir: Path, overrides: dict = TINY_RUN) -> None:
    """The run's overrides were its own: params.yaml is as committed; and DVC recorded the run at them: with them
    written in again, a `dvc repro` would redo nothing (the source stage always runs: not counted)."""
    from flows.infra import dvc_stages
    from flows.infra.params_file import apply_overrides, one_off

    assert git(["status", "--porcelain", "--", "params.yaml"], workdir) == "", "the run left its overrides"
    with one_off(Path(workdir) / "params.yaml"):
        apply_overrides(Path(workdir) / "params.yaml", overrides)
        assert dvc_stages.status_all(workdir) == {}


def copy_working_tree(dest: Path) -> Path:
    """This repository's working tree as it is (tracked and untracked, not ignored), committed anew."""
    files = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], REPO).split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(src.read_bytes())
    git(["init", "-q", "-b", "main"], dest)
    git(["add", "-A"], dest)
    git(["commit", "-q", "-m", "copy of the working tree"], dest)
    return dest


def git(args: list[str], cwd: Path) -> str:
    return run(["git", "-c", "user.name=tests", "-c", "user.email=tests@localhost", *args], cwd)


def make_toy_repo(root: Path, with_flows: bool = False, models=("none", "concat"), seeds=(0,)) -> Path:
    """A git + DVC project shaped like the pipeline (prep -> train/evaluate matrix -> report ->
    register -> promote), committed. `with_flows`: also flows/ and prefect.yaml, for deployments."""
    root.mkdir(parents=True, exist_ok=True)
    git(["init", "-q", "-b", "main"], root)
    run([str(VENV_BIN / "dvc"), "init", "-q"], root)
    (root / "toy_stage.py").write_text(TOY_STAGE)
    (root / "dvc.yaml").write_text(TOY_DVC_YAML)
    params = TOY_PARAMS.replace("[none, concat]", "[" + ", ".join(models) + "]")
    (root / "params.yaml").write_text(params.replace("seeds: [0]", f"seeds: [{', '.join(map(str, seeds))}]"))
    (root / ".gitignore").write_text("__pycache__/\n/mlflow.db\n")
    if with_flows:
        shutil.copytree(REPO / "flows", root / "flows", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(REPO / "prefect.yaml", root / "prefect.yaml")
    git(["add", "-A"], root)
    git(["commit", "-q", "-m", "toy project"], root)
    return root


def dvc(args: list[str], cwd: Path, timeout: float = 120) -> str:
    return run([str(VENV_BIN / "dvc"), *args], cwd, clean_env(), timeout)
