"""The whole stack on one machine, without compose: PostgreSQL, Prefect and MLflow servers on it, a DVC
remote directory, and workers in directories of their own (which see nothing of the workspace).

    python -m flows.infra.stack up [--dir .stack] [--workers 2]    # start; prints the environment to use
    python -m flows.infra.stack status
    python -m flows.infra.stack down

- PostgreSQL: a private cluster (`initdb` + `pg_ctl`, Debian's `postgresql` package: binaries under
  /usr/lib/postgresql/<version>/bin) in <dir>/postgres on a free port of 127.0.0.1, trust
  authentication for local connections; as root it runs as the `postgres` user (PostgreSQL refuses
  root). Databases `prefect` and `mlflow`.
- Prefect server: PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://... (driver asyncpg).
- MLflow server: --backend-store-uri postgresql://... (tracking and registry; driver psycopg2) and
  --artifacts-destination <dir>/mlartifacts: the artifact root (s3://bucket/prefix with
  MLFLOW_S3_ENDPOINT_URL and AWS_* credentials for S3-compatible stores, docs/scaling.md).
- Pools, slots and the zombie automation: `python -m flows.infra.work_pools`; workers: `prefect worker start
  --pool cpu --work-queue default` in <dir>/worker-<i> for the trainings, their temporary files in
  <dir>/worker-<i>/tmp, and `--work-queue pipeline` in <dir>/worker-pipeline for the flows that drive
  them (the pipeline, training, promotion), so killing a training worker never kills a parent flow.

The pieces (`Postgres`, the server commands) are the ones the integration tests start.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from flows.infra.net import free_port, wait_healthy
from flows.infra.work_pools import CPU_POOL, PIPELINE_QUEUE, RESILIENT_ENV, TRAIN_QUEUE

BIN = Path(sys.executable).parent  # the venv's bin/: prefect, mlflow, dvc
PG_USER = "postgres"  # the database superuser, and the system user that runs the cluster as root



def pg_bindir() -> Path | None:
    """Where initdb and pg_ctl are: on PATH, else Debian's /usr/lib/postgresql/<newest>/bin."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
                        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    return candidates[-1].parent if candidates else None


def postgres_missing() -> str | None:
    """Why no private PostgreSQL cluster can be started here, or None when one can."""
    if pg_bindir() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install -y postgresql"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(PG_USER)
        except KeyError:
            return f"running as root and no '{PG_USER}' user to run PostgreSQL as (initdb refuses root)"
    return None


@dataclass
class Postgres:
    """A private PostgreSQL cluster in `datadir`, listening on 127.0.0.1:`port` only."""

    datadir: Path
    port: int

    @property
    def as_root(self) -> bool:
        return os.geteuid() == 0

    def _run(self, tool: str, *args: str, timeout: float = 120) -> str:
        bindir = pg_bindir()
        if bindir is None:
            raise RuntimeError(postgres_missing())
        kwargs = {}
        if self.as_root:  # initdb and postgres refuse to run as root
            kwargs = dict(user=PG_USER, group=pwd.getpwnam(PG_USER).pw_gid)
        proc = subprocess.run([str(bindir / tool), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, cwd="/", **kwargs)
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}")
        return proc.stdout

    @property
    def log(self) -> Path:
        return self.datadir.parent / f"{self.datadir.name}.log"

    def init(self) -> None:
        self.datadir.mkdir(parents=True, exist_ok=True)
        self.datadir.chmod(0o700)
        if self.as_root:
            user = pwd.getpwnam(PG_USER)
            os.chown(self.datadir, user.pw_uid, user.pw_gid)
            self.log.touch()
            os.chown(self.log, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.datadir), "-U", PG_USER, "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")

    def start(self) -> None:
        # The socket lives in the data directory: the system's /var/run/postgresql may not be writable.
        self._run("pg_ctl", "-D", str(self.datadir), "-l", str(self.log), "-w", "-t", "60", "-o",
                  f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.datadir} -c fsync=off", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "-t", "60", "stop")

    def running(self) -> bool:
        try:
            self._run("pg_ctl", "-D", str(self.datadir), "status")
            return True
        except RuntimeError:
            return False

    def create_database(self, name: str) -> None:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER, name)

    def url(self, database: str, driver: str | None = None) -> str:
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://{PG_USER}@127.0.0.1:{self.port}/{database}"


def prefect_server_command(port: int, scheduler: bool = True) -> list[str]:
    cmd = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"]
    return cmd if scheduler else cmd + ["--no-scheduler"]


def prefect_server_env(pg: Postgres, home: Path) -> dict[str, str]:
    return {"PREFECT_HOME": str(home),
            "PREFECT_API_DATABASE_CONNECTION_URL": pg.url("prefect", "asyncpg")}


def mlflow_server_command(pg: Postgres, port: int, artifact_root: str) -> list[str]:
    """An MLflow server with tracking and registry in PostgreSQL; artifacts under `artifact_root`
    (a directory here; s3://bucket/prefix elsewhere)."""
    return [str(BIN / "mlflow"), "server", "--backend-store-uri", pg.url("mlflow", "psycopg2"), "--artifacts-destination",
            artifact_root, "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]


def worker_command(pool: str, name: str, queue: str | None = None) -> list[str]:
    """A process worker on `pool`; on `queue` only when given (else on every queue of the pool)."""
    return [str(BIN / "prefect"), "worker", "start", "--pool", pool, "--name", name, "--type", "process",
            *(["--work-queue", queue] if queue else [])]


# --- the script: detached processes, their pids in <dir>/pids -------------------------------------


def _spawn(root: Path, name: str, cmd: list[str], cwd: Path, env: dict[str, str]) -> int:
    (root / "logs").mkdir(parents=True, exist_ok=True)
    (root / "pids").mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    with open(root / "logs" / f"{name}.log", "ab") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    (root / "pids" / f"{name}.pid").write_text(str(proc.pid))
    return proc.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def up(root: Path, workers: int) -> dict[str, str]:
    root = root.resolve()
    if (root / "stack.json").exists():
        raise SystemExit(f"{root}/stack.json exists: `python -m flows.infra.stack down --dir {root}` first")
    reason = postgres_missing()
    if reason:
        raise SystemExit(reason)
    started = time.monotonic()
    pg = Postgres(root / "postgres", free_port())
    pg.init()
    pg.start()
    for db in ("prefect", "mlflow"):
        pg.create_database(db)
    prefect_port, mlflow_port = free_port(), free_port()
    api, mlflow_uri = f"http://127.0.0.1:{prefect_port}/api", f"http://127.0.0.1:{mlflow_port}"
    state = {"postgres": str(pg.datadir), "postgres_port": pg.port, "PREFECT_API_URL": api,
             "MLFLOW_TRACKING_URI": mlflow_uri, "dvc_remote": str(root / "dvc-remote")}
    (root / "stack.json").write_text(json.dumps(state, indent=2))
    pid = _spawn(root, "prefect-server", prefect_server_command(prefect_port), root,
                 prefect_server_env(pg, root / "prefect-home"))
    wait_healthy(f"{api}/health", 180, "prefect server", lambda: _alive(pid))
    pid = _spawn(root, "mlflow-server", mlflow_server_command(pg, mlflow_port, str(root / "mlartifacts")), root, {})
    wait_healthy(f"{mlflow_uri}/health", 180, "mlflow server", lambda: _alive(pid))
    client_env = {**os.environ, "PREFECT_API_URL": api, "MLFLOW_TRACKING_URI": mlflow_uri}
    subprocess.run([sys.executable, "-m", "flows.infra.work_pools", "--cpu-trainings", str(workers)], check=True,
                   env=client_env, cwd=Path(__file__).resolve().parents[1])
    worker_env = {"PREFECT_API_URL": api, "MLFLOW_TRACKING_URI": mlflow_uri, **RESILIENT_ENV}
    # The flows that drive the trainings on a worker of their own, the trainings on the others: a
    # worker lost under a training never takes its parent flow with it (flows/infra/work_pools.py).
    _spawn(root, "worker-pipeline", worker_command(CPU_POOL, "worker-pipeline", PIPELINE_QUEUE),
           root / "worker-pipeline", worker_env)
    for i in range(1, workers + 1):
        wdir = root / f"worker-{i}"
        (wdir / "tmp").mkdir(parents=True, exist_ok=True)
        _spawn(root, f"worker-{i}", worker_command(CPU_POOL, f"worker-{i}", TRAIN_QUEUE), wdir,
               {**worker_env, "TMPDIR": str(wdir / "tmp")})
    (root / "dvc-remote").mkdir(exist_ok=True)
    print(f"stack up in {time.monotonic() - started:.0f} s; use it with:")
    print(f"  export PREFECT_API_URL={api} MLFLOW_TRACKING_URI={mlflow_uri}")
    print(f"  dvc remote add -d stack {root / 'dvc-remote'}   # then commit .dvc/config and git push")
    print("  make prefect-deploy && make prefect-run SIZE=tiny   # or a run with fan_out=remote")
    return state


def down(root: Path) -> None:
    root = root.resolve()
    pids = sorted((root / "pids").glob("*.pid")) if (root / "pids").exists() else []
    # Workers first, then the servers: what talks to a server goes before it.
    for pidfile in sorted(pids, key=lambda p: not p.stem.startswith("worker")):
        pid = int(pidfile.read_text())
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 5)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.5)
            if not _alive(pid):
                break
        pidfile.unlink()
        print(f"stopped {pidfile.stem}")
    state = root / "stack.json"
    if state.exists():
        info = json.loads(state.read_text())
        pg = Postgres(Path(info["postgres"]), int(info["postgres_port"]))
        if pg.running():
            pg.stop()
            print("stopped postgres")
        state.unlink()


def status(root: Path) -> None:
    root = root.resolve()
    if not (root / "stack.json").exists():
        print(f"no stack in {root}")
        return
    info = json.loads((root / "stack.json").read_text())
    print(json.dumps(info, indent=2))
    for pidfile in sorted((root / "pids").glob("*.pid")):
        print(f"{pidfile.stem}: {'up' if _alive(int(pidfile.read_text())) else 'DOWN'}")
    print(f"postgres: {'up' if Postgres(Path(info['postgres']), info['postgres_port']).running() else 'DOWN'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.infra.stack", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=Path(".stack"))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.action == "up":
        up(args.dir, args.workers)
    elif args.action == "down":
        down(args.dir)
    else:
        status(args.dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
