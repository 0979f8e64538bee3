"""The whole stack on one machine, without compose: PostgreSQL, Prefect and MLflow servers on it, a DVC
remote directory, and workers in directories of their own (which see nothing of the workspace).

    python -m flows.infra.stack up [--dir .stack] [--workers 2] [--host 127.0.0.1]   # start
    eval "$(python -m flows.infra.stack env --as trainer)"    # a client's environment (trainer|promoter|admin)
    python -m flows.infra.stack status
    python -m flows.infra.stack down
    python -m flows.infra.stack rotate    # new secrets for every role; what holds them restarted

- PostgreSQL: a private cluster (`initdb` + `pg_ctl`, Debian's `postgresql` package: binaries under
  /usr/lib/postgresql/<version>/bin) in <dir>/postgres on a free port of 127.0.0.1, scram-sha-256
  authentication for every connection; as root it runs as the `postgres` user (PostgreSQL refuses
  root). Databases `prefect` and `mlflow`, each owned by a role of its name with its own password.
- Secrets: <dir>/credentials.env (0600), made at the first `up` (flows/infra/auth.py); the database
  passwords reach the servers through <dir>/pgpass (PGPASSFILE), never in a URL. <dir> must be this
  user's, no symbolic link, writable by no one else; everything in it is 0600 / 0700 (umask 077), and
  <dir> itself 0700 (0711 as root: the `postgres` user must reach its data directory).
- No server holds a secret in its environment: the Prefect server reads its auth string from a profile
  (<dir>/prefect-home/profiles.toml), MLflow's admin is written into its user database before it starts,
  PostgreSQL's superuser password goes to psql only (the MLflow auth app's Flask key stays, see
  docs/security.md). Telemetry off (PREFECT_SERVER_ANALYTICS_ENABLED=false, DO_NOT_TRACK=1).
- Prefect server: PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://prefect@... (driver asyncpg);
  every worker and flow run has PREFECT_API_AUTH_STRING.
- MLflow server: --app-name contextual-bert-auth (basic-auth; only MANAGE moves 'champion'),
  --backend-store-uri postgresql://mlflow@... (tracking and registry; driver psycopg2) and
  --artifacts-destination <dir>/mlartifacts: the artifact root (s3://bucket/prefix with
  MLFLOW_S3_ENDPOINT_URL and AWS_* credentials for S3-compatible stores, docs/scaling.md). Users
  trainer (every worker: the trainings and the pipeline worker, which registers) and promoter, which
  no worker holds: promotion runs outside Prefect (`eval "$(... env --as promoter)"; contextual-bert
  promote`), since the auth string every worker holds can run any code on any worker (docs/security.md).
- Both servers listen on 127.0.0.1 unless `--host` names another address.
- Pools, slots and the zombie automation: `python -m flows.infra.work_pools`; workers: `prefect worker start
  --pool cpu --work-queue default` in <dir>/worker-<i> for the trainings, their temporary files in
  <dir>/worker-<i>/tmp, and `--work-queue pipeline` in <dir>/worker-pipeline for the flows that drive
  them (the pipeline, training, promotion), so killing a training worker never kills a parent flow.
- `down` then `up` restarts on the same cluster and databases; `rotate` sets new passwords in PostgreSQL
  (with the old superuser password), writes the new file, and restarts everything (`down`, `up`), which
  sets MLflow's users and the Prefect auth string from it: the old secrets are refused afterwards.

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
DB_ROLES = ("prefect", "mlflow")  # a database each, owned by a login role of its name
# As root the cluster runs as PG_USER, which must pass through <dir> to its data directory (no listing).
STACK_DIR_MODE = 0o711 if os.geteuid() == 0 else 0o700
# Telemetry off for every process the stack starts (Prefect's server analytics; the common opt-out).
NO_TELEMETRY = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
PREFECT_PROFILE = "contextual-bert"


def stack_path(root: Path) -> Path:
    """`root` made absolute without following a symbolic link in it: the checks must see the link."""
    return Path(os.path.abspath(root))


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
        # The superuser's password through psql's environment (not the command line, which `ps` shows);
        # never pg_ctl's, whose server would keep it in its own.
        env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
        if tool == "psql":
            env["PGPASSWORD"] = self.password
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

    @property
    def initialized(self) -> bool:
        """initdb has run here (a `down` keeps the cluster: `up` starts it again)."""
        return (self.datadir / "PG_VERSION").exists()

    def init(self) -> None:
        self.datadir.mkdir(parents=True, exist_ok=True)
        self.datadir.chmod(0o700)
        if not self.log.exists():
            auth.write_private(self.log, "")
        if self.as_root:
            user = pwd.getpwnam(PG_USER)
            os.chown(self.datadir, user.pw_uid, user.pw_gid)
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
        """Database `name` owned by a login role `name` (what `url` connects as)."""
        self.sql(f"CREATE ROLE {name} LOGIN PASSWORD '{owner_password}';\nCREATE DATABASE {name} OWNER {name};\n")

    def set_passwords(self, creds: dict[str, str]) -> None:
        """The superuser's and the database roles' passwords from `creds`, in one transaction (connecting
        with `self.password`, the current superuser password)."""
        roles = {PG_USER: creds["POSTGRES_PASSWORD"], **{r: creds[f"{r.upper()}_DB_PASSWORD"] for r in DB_ROLES}}
        self.sql("BEGIN;\n" + "".join(f"ALTER ROLE {r} PASSWORD '{p}';\n" for r, p in roles.items()) + "COMMIT;\n")

    def sql(self, script: str) -> None:
        """Run `script` as the superuser. The SQL goes through stdin: a password on psql's command line
        would show in `ps`."""
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
            input=script,
        )

    def url(self, database: str, driver: str | None = None) -> str:
        """No password in it: the servers read theirs from PGPASSFILE (auth.write_pgpass)."""
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://{database}@127.0.0.1:{self.port}/{database}"


def prefect_server_command(port: int, scheduler: bool = True, host: str = "127.0.0.1") -> list[str]:
    cmd = [str(BIN / "prefect"), "server", "start", "--host", host, "--port", str(port), "--no-ui"]
    return cmd if scheduler else cmd + ["--no-scheduler"]


def write_prefect_profile(home: Path, creds: dict[str, str], **settings: str) -> Path:
    """<home>/profiles.toml (0600, in a private <home>): the auth string, server and client side, and
    `settings`, as the active profile: a Prefect process with PREFECT_HOME=<home> reads them from there,
    so its environment holds no secret."""
    auth.private_dir(home)
    values = {**auth.prefect_server_env(creds), **auth.prefect_client_env(creds), **settings}
    path = home / "profiles.toml"
    body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
    auth.write_private(path, f'active = "{PREFECT_PROFILE}"\n\n[profiles.{PREFECT_PROFILE}]\n{body}')
    return path


def prefect_server_env(pg: Postgres, home: Path, creds: dict[str, str], pgpass: Path) -> dict[str, str]:
    write_prefect_profile(home, creds)
    return {
        "PREFECT_HOME": str(home),
        "PREFECT_API_DATABASE_CONNECTION_URL": pg.url("prefect", "asyncpg"),
        "PGPASSFILE": str(pgpass),
        **NO_TELEMETRY,
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
    auth.set_mlflow_admin(root, creds)
    return {"PGPASSFILE": str(pgpass), **NO_TELEMETRY, **auth.mlflow_server_env(root, creds)}


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
    auth.private_dir(root / "logs")
    auth.private_dir(root / "pids")
    with auth.open_log(root / "logs" / f"{name}.log") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env={**os.environ, **NO_TELEMETRY, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    auth.write_private(root / "pids" / f"{name}.pid", str(proc.pid))
    return proc.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def up(root: Path, workers: int, host: str = "127.0.0.1") -> dict[str, Any]:
    root = stack_path(root)
    os.umask(0o077)  # every file and directory this process and the servers it starts make: private
    creds = auth.credentials(root, STACK_DIR_MODE)  # refuses a link, another user's or a shared directory
    if (root / "stack.json").exists():
        raise SystemExit(f"{root}/stack.json exists: `python -m flows.infra.stack down --dir {root}` first")
    reason = postgres_missing()
    if reason:
        raise SystemExit(reason)
    started = time.monotonic()
    pg = Postgres(root / "postgres", free_port(), creds["POSTGRES_PASSWORD"])
    if pg.initialized:  # after `down`: the same cluster, its databases; the roles' passwords from the file
        pg.start()
        pg.set_passwords(creds)
    else:
        pg.init()
        pg.start()
        for db in DB_ROLES:
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
        "workers": workers,
        "host": host,
    }
    auth.write_private(root / "stack.json", json.dumps(state, indent=2))
    pid = _spawn(
        root,
        "prefect-server",
        prefect_server_command(prefect_port, host=host),
        root,
        prefect_server_env(pg, root / "prefect-home", creds, pgpass),
    )
    wait_healthy(f"{api}/health", 180, "prefect server", lambda: _alive(pid))
    auth.private_dir(root / "mlartifacts")
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
    # Every worker is MLflow user trainer, the pipeline worker too: any holder of the auth string can run
    # code on any worker (a deployment's pull steps, a pool's template), so none holds the promoter's.
    worker_env = {**urls, **RESILIENT_ENV, **client_env(creds, "trainer")}
    # The flows that drive the trainings on a worker of their own, the trainings on the others: a
    # worker lost under a training never takes its parent flow with it (flows/infra/work_pools.py).
    _spawn(
        root,
        "worker-pipeline",
        worker_command(CPU_POOL, "worker-pipeline", PIPELINE_QUEUE),
        auth.private_dir(root / "worker-pipeline"),
        worker_env,
    )
    for i in range(1, workers + 1):
        wdir = auth.private_dir(root / f"worker-{i}")
        auth.private_dir(wdir / "tmp")
        _spawn(
            root,
            f"worker-{i}",
            worker_command(CPU_POOL, f"worker-{i}", TRAIN_QUEUE),
            wdir,
            {**worker_env, "TMPDIR": str(wdir / "tmp")},
        )
    auth.private_dir(root / "dvc-remote")
    print(f"stack up in {time.monotonic() - started:.0f} s; secrets in {root / auth.CREDENTIALS} (0600); use it with:")
    print(f'  eval "$(python -m flows.infra.stack env --dir {root} --as promoter)"   # URLs and credentials')
    print(f"  dvc remote add -d stack {root / 'dvc-remote'}   # then commit .dvc/config and git push")
    print("  make prefect-deploy && make prefect-run SIZE=tiny REGISTRY=false   # or a run with FAN_OUT=remote")
    print("  registry outside the workers, as promoter: dvc repro register promote   (docs/security.md)")
    return state


def rotate(root: Path) -> None:
    """New secrets for every role: PostgreSQL's passwords changed first (with the old superuser
    password), then the file, then everything restarted from it (`down`, `up`): the MLflow users and the
    Prefect auth string are set at `up`. A serving gate started elsewhere must be restarted by hand."""
    root = stack_path(root)
    os.umask(0o077)
    if not (root / "stack.json").exists():
        raise SystemExit(f"no stack running in {root}: `python -m flows.infra.stack up --dir {root}` first")
    info = json.loads(auth.read_private(root / "stack.json"))
    old = auth.read_env_file(root / auth.CREDENTIALS)
    new = auth.new_secrets()
    pg = Postgres(Path(info["postgres"]), int(info["postgres_port"]), old["POSTGRES_PASSWORD"])
    pg.set_passwords(new)
    auth.write_credentials(root, new)
    print(f"new secrets in {root / auth.CREDENTIALS}; restarting what holds them")
    down(root)
    up(root, int(info.get("workers", 2)), info.get("host", "127.0.0.1"))
    print("rotated: the old secrets are refused; restart any serving gate (SERVING_TOKEN changed)")


def prefect_server(home: Path, secrets_dir: Path, port: int) -> None:
    """`make prefect-server`: a Prefect server on 127.0.0.1:`port` (SQLite in `home`) that needs the auth
    string of <secrets_dir>/credentials.env; the profile in `home` gives it to the clients that share
    that PREFECT_HOME (`make prefect-worker`, `prefect-deploy`, `prefect-run`). Replaces this process."""
    os.umask(0o077)
    creds = auth.credentials(stack_path(secrets_dir), STACK_DIR_MODE)
    write_prefect_profile(stack_path(home), creds, PREFECT_API_URL=f"http://127.0.0.1:{port}/api")
    cmd = prefect_server_command(port)[:-1]  # with the UI (`make prefect-ui`)
    os.execve(cmd[0], cmd, {**os.environ, "PREFECT_HOME": str(stack_path(home)), **NO_TELEMETRY})


def env(root: Path, user: str) -> str:
    """`export` lines for a client of the stack as MLflow user `user`, for eval (they hold secrets:
    never paste them into a file that is committed or a log)."""
    root = stack_path(root)
    if not (root / "stack.json").exists():
        raise SystemExit(f"no stack in {root}")
    info = json.loads(auth.read_private(root / "stack.json"))
    creds = auth.read_env_file(root / auth.CREDENTIALS)
    values = {
        "PREFECT_API_URL": info["PREFECT_API_URL"],
        "MLFLOW_TRACKING_URI": info["MLFLOW_TRACKING_URI"],
        **client_env(creds, user),
    }
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in values.items())


def down(root: Path) -> None:
    root = stack_path(root)
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
    root = stack_path(root)
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
    parser.add_argument("action", choices=["up", "down", "status", "env", "rotate", "prefect-server"])
    parser.add_argument("--dir", type=Path, default=Path(".stack"))
    parser.add_argument("--prefect-home", type=Path, default=Path(".prefect"), help="prefect-server: its PREFECT_HOME")
    parser.add_argument("--port", type=int, default=4200, help="prefect-server: its port")
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
    elif args.action == "rotate":
        rotate(args.dir)
    elif args.action == "prefect-server":
        prefect_server(args.prefect_home, args.dir, args.port)
    else:
        status(args.dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
