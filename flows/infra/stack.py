"""The whole stack on one machine, without compose: PostgreSQL, Prefect and MLflow servers on it, a DVC
remote directory, and workers in directories of their own (which see nothing of the workspace).

    python -m flows.infra.stack up [--dir .stack] [--workers 2] [--host 127.0.0.1]   # start
    eval "$(python -m flows.infra.stack env --as trainer)"    # a client's environment (trainer|promoter|admin)
    python -m flows.infra.stack status
    python -m flows.infra.stack down

- PostgreSQL: a private cluster (`initdb` + `pg_ctl`, Debian's `postgresql` package: binaries under
  /usr/lib/postgresql/<version>/bin) in <dir>/postgres on a free port of 127.0.0.1, scram-sha-256
  authentication for every connection; as root it runs as the `postgres` user (PostgreSQL refuses
  root). Databases `prefect` and `mlflow`, each owned by a role of its name with its own password.
- Secrets: <dir>/credentials.env (0600), made at the first `up` (flows/infra/auth.py); the database
  passwords reach the servers through <dir>/pgpass (PGPASSFILE), never in a URL.
- Prefect server: PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://prefect@... (driver asyncpg),
  PREFECT_SERVER_API_AUTH_STRING; every worker and flow run has PREFECT_API_AUTH_STRING.
- MLflow server: --app-name contextual-bert-auth (basic-auth; only MANAGE moves 'champion'),
  --backend-store-uri postgresql://mlflow@... (tracking and registry; driver psycopg2) and
  --artifacts-destination <dir>/mlartifacts: the artifact root (s3://bucket/prefix with
  MLFLOW_S3_ENDPOINT_URL and AWS_* credentials for S3-compatible stores, docs/scaling.md). Users
  trainer (the training workers) and promoter (the pipeline worker, which runs register and promote).
- Both servers listen on 127.0.0.1 unless `--host` names another address.
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
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.infra import auth
from flows.infra.net import free_port, wait_healthy
from flows.infra.work_pools import CPU_POOL, PIPELINE_QUEUE, RESILIENT_ENV, TRAIN_QUEUE

BIN = Path(sys.executable).parent  # the venv's bin/: prefect, mlflow, dvc
PG_USER = "postgres"  # the database superuser, and the system user that runs the cluster as root


def pg_bindir() -> Path | None:
    """Where initdb and pg_ctl are: on PATH, else Debian's /usr/lib/postgresql/<newest>/bin."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
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
    password: str  # the superuser's (scram-sha-256 for every connection, also on the socket)

    @property
    def as_root(self) -> bool:
        return os.geteuid() == 0

    def _run(self, tool: str, *args: str, timeout: float = 120, input: str | None = None) -> str:
        bindir = pg_bindir()
        if bindir is None:
            raise RuntimeError(postgres_missing())
        kwargs: dict[str, Any] = {}
        if self.as_root:  # initdb and postgres refuse to run as root
            kwargs = dict(user=PG_USER, group=pwd.getpwnam(PG_USER).pw_gid)
        # The superuser's password through the environment (not the command line, which `ps` shows).
        env = {**os.environ, "PGPASSWORD": self.password}
        proc = subprocess.run(
            [str(bindir / tool), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            cwd="/",
            input=input,
            env=env,
            **kwargs,
        )
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
        # initdb reads the password from a file; it lives only while initdb runs.
        pwfile = self.datadir.parent / f".{self.datadir.name}.pw"
        auth.write_private(pwfile, self.password + "\n")
        try:
            if self.as_root:
                os.chown(pwfile, user.pw_uid, user.pw_gid)
            self._run(
                "initdb",
                "-D",
                str(self.datadir),
                "-U",
                PG_USER,
                "--auth=scram-sha-256",
                f"--pwfile={pwfile}",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            )
        finally:
            pwfile.unlink(missing_ok=True)

    def start(self) -> None:
        # The socket lives in the data directory: the system's /var/run/postgresql may not be writable.
        self._run(
            "pg_ctl",
            "-D",
            str(self.datadir),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.datadir} -c fsync=off",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "-t", "60", "stop")

    def running(self) -> bool:
        try:
            self._run("pg_ctl", "-D", str(self.datadir), "status")
            return True
        except RuntimeError:
            return False

    def create_database(self, name: str, owner_password: str) -> None:
        """Database `name` owned by a login role `name` (what `url` connects as). The SQL goes through
        stdin: a password on psql's command line would show in `ps`."""
        self._run(
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            PG_USER,
            "-d",
            "postgres",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-f",
            "-",
            input=f"CREATE ROLE {name} LOGIN PASSWORD '{owner_password}';\nCREATE DATABASE {name} OWNER {name};\n",
        )

    def url(self, database: str, driver: str | None = None) -> str:
        """No password in it: the servers read theirs from PGPASSFILE (auth.write_pgpass)."""
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://{database}@127.0.0.1:{self.port}/{database}"


def prefect_server_command(port: int, scheduler: bool = True, host: str = "127.0.0.1") -> list[str]:
    cmd = [str(BIN / "prefect"), "server", "start", "--host", host, "--port", str(port), "--no-ui"]
    return cmd if scheduler else cmd + ["--no-scheduler"]


def prefect_server_env(pg: Postgres, home: Path, creds: dict[str, str], pgpass: Path) -> dict[str, str]:
    return {
        "PREFECT_HOME": str(home),
        "PREFECT_API_DATABASE_CONNECTION_URL": pg.url("prefect", "asyncpg"),
        "PGPASSFILE": str(pgpass),
        **auth.prefect_server_env(creds),
        **auth.prefect_client_env(creds),
    }


def mlflow_server_command(pg: Postgres, port: int, artifact_root: str, host: str = "127.0.0.1") -> list[str]:
    """An MLflow server with tracking and registry in PostgreSQL, behind the auth app; artifacts under
    `artifact_root` (a directory here; s3://bucket/prefix elsewhere)."""
    return [
        str(BIN / "mlflow"),
        "server",
        "--app-name",
        auth.MLFLOW_APP,
        "--backend-store-uri",
        pg.url("mlflow", "psycopg2"),
        "--artifacts-destination",
        artifact_root,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def mlflow_server_env(root: Path, creds: dict[str, str], pgpass: Path) -> dict[str, str]:
    return {"PGPASSFILE": str(pgpass), **auth.mlflow_server_env(root, creds)}


def client_env(creds: dict[str, str], user: str) -> dict[str, str]:
    """What a client of both servers needs besides the URLs: Prefect's auth string, MLflow user `user`."""
    return {**auth.prefect_client_env(creds), **auth.mlflow_user_env(creds, user)}


def mlflow_names(workspace: Path) -> tuple[str, str]:
    """The experiment and registered model the workspace's params.yaml names (the stack creates both)."""
    from contextual_bert.config import MlflowConfig, load_config

    params = workspace / "params.yaml"
    cfg = load_config(params).mlflow if params.exists() else MlflowConfig()
    return cfg.experiment, cfg.model_name


def worker_command(pool: str, name: str, queue: str | None = None) -> list[str]:
    """A process worker on `pool`; on `queue` only when given (else on every queue of the pool)."""
    return [
        str(BIN / "prefect"),
        "worker",
        "start",
        "--pool",
        pool,
        "--name",
        name,
        "--type",
        "process",
        *(["--work-queue", queue] if queue else []),
    ]


# --- the script: detached processes, their pids in <dir>/pids -------------------------------------


def _spawn(root: Path, name: str, cmd: list[str], cwd: Path, env: dict[str, str]) -> int:
    (root / "logs").mkdir(parents=True, exist_ok=True)
    (root / "pids").mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    with open(root / "logs" / f"{name}.log", "ab") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    (root / "pids" / f"{name}.pid").write_text(str(proc.pid))
    return proc.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def up(root: Path, workers: int, host: str = "127.0.0.1") -> dict[str, Any]:
    root = root.resolve()
    if (root / "stack.json").exists():
        raise SystemExit(f"{root}/stack.json exists: `python -m flows.infra.stack down --dir {root}` first")
    reason = postgres_missing()
    if reason:
        raise SystemExit(reason)
    started = time.monotonic()
    creds = auth.credentials(root)
    pg = Postgres(root / "postgres", free_port(), creds["POSTGRES_PASSWORD"])
    pg.init()
    pg.start()
    for db in ("prefect", "mlflow"):
        pg.create_database(db, creds[f"{db.upper()}_DB_PASSWORD"])
    pgpass = auth.write_pgpass(root, pg.port, creds)
    prefect_port, mlflow_port = free_port(), free_port()
    # Clients on this machine use loopback; elsewhere the address the servers were bound to.
    reach = "127.0.0.1" if host in ("127.0.0.1", "0.0.0.0", "::") else host
    api, mlflow_uri = f"http://{reach}:{prefect_port}/api", f"http://{reach}:{mlflow_port}"
    state = {
        "postgres": str(pg.datadir),
        "postgres_port": pg.port,
        "PREFECT_API_URL": api,
        "MLFLOW_TRACKING_URI": mlflow_uri,
        "dvc_remote": str(root / "dvc-remote"),
        "credentials": str(root / auth.CREDENTIALS),
    }
    (root / "stack.json").write_text(json.dumps(state, indent=2))
    pid = _spawn(
        root,
        "prefect-server",
        prefect_server_command(prefect_port, host=host),
        root,
        prefect_server_env(pg, root / "prefect-home", creds, pgpass),
    )
    wait_healthy(f"{api}/health", 180, "prefect server", lambda: _alive(pid))
    pid = _spawn(
        root,
        "mlflow-server",
        mlflow_server_command(pg, mlflow_port, str(root / "mlartifacts"), host),
        root,
        mlflow_server_env(root, creds, pgpass),
    )
    wait_healthy(f"{mlflow_uri}/health", 180, "mlflow server", lambda: _alive(pid))
    repo = Path(__file__).resolve().parents[2]
    auth.setup_mlflow(mlflow_uri, creds, *mlflow_names(repo))
    urls = {"PREFECT_API_URL": api, "MLFLOW_TRACKING_URI": mlflow_uri}
    subprocess.run(
        [sys.executable, "-m", "flows.infra.work_pools", "--cpu-trainings", str(workers)],
        check=True,
        env={**os.environ, **urls, **client_env(creds, "promoter")},
        cwd=repo,
    )
    # The training workers log as trainer; the pipeline worker runs register and promote: promoter.
    worker_env = {**urls, **RESILIENT_ENV}
    # The flows that drive the trainings on a worker of their own, the trainings on the others: a
    # worker lost under a training never takes its parent flow with it (flows/infra/work_pools.py).
    _spawn(
        root,
        "worker-pipeline",
        worker_command(CPU_POOL, "worker-pipeline", PIPELINE_QUEUE),
        root / "worker-pipeline",
        {**worker_env, **client_env(creds, "promoter")},
    )
    for i in range(1, workers + 1):
        wdir = root / f"worker-{i}"
        (wdir / "tmp").mkdir(parents=True, exist_ok=True)
        _spawn(
            root,
            f"worker-{i}",
            worker_command(CPU_POOL, f"worker-{i}", TRAIN_QUEUE),
            wdir,
            {**worker_env, **client_env(creds, "trainer"), "TMPDIR": str(wdir / "tmp")},
        )
    (root / "dvc-remote").mkdir(exist_ok=True)
    print(f"stack up in {time.monotonic() - started:.0f} s; secrets in {root / auth.CREDENTIALS} (0600); use it with:")
    print(f'  eval "$(python -m flows.infra.stack env --dir {root} --as promoter)"   # URLs and credentials')
    print(f"  dvc remote add -d stack {root / 'dvc-remote'}   # then commit .dvc/config and git push")
    print("  make prefect-deploy && make prefect-run SIZE=tiny   # or a run with fan_out=remote")
    return state


def env(root: Path, user: str) -> str:
    """`export` lines for a client of the stack as MLflow user `user`, for eval (they hold secrets:
    never paste them into a file that is committed or a log)."""
    root = root.resolve()
    if not (root / "stack.json").exists():
        raise SystemExit(f"no stack in {root}")
    info = json.loads((root / "stack.json").read_text())
    creds = auth.read_env_file(root / auth.CREDENTIALS)
    values = {
        "PREFECT_API_URL": info["PREFECT_API_URL"],
        "MLFLOW_TRACKING_URI": info["MLFLOW_TRACKING_URI"],
        **client_env(creds, user),
    }
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in values.items())


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
        pg = Postgres(Path(info["postgres"]), int(info["postgres_port"]), "")  # pg_ctl needs no password
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
    print(f"postgres: {'up' if Postgres(Path(info['postgres']), info['postgres_port'], '').running() else 'DOWN'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.infra.stack", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down", "status", "env"])
    parser.add_argument("--dir", type=Path, default=Path(".stack"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="the servers' address (default loopback only; docs/scaling.md before another)",
    )
    parser.add_argument(
        "--as", dest="user", default="trainer", choices=["trainer", "promoter", "admin"], help="env: the MLflow user"
    )
    args = parser.parse_args(argv)
    if args.action == "up":
        up(args.dir, args.workers, args.host)
    elif args.action == "env":
        print(env(args.dir, args.user))
    elif args.action == "down":
        down(args.dir)
    else:
        status(args.dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
