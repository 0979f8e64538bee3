"""The stack as an operator runs it: `python -m flows.infra.stack up`, `down`, `up` again, `rotate` (issue 90).

One stack, one training worker, in order:
- test_the_stack_files_are_private: every file 0600, every directory 0700 (the stack's own 0711 as root),
  all the user's (the cluster's, `postgres`'s).
- test_no_secret_in_a_server_environment: /proc/<pid>/environ and the command line of PostgreSQL, Prefect
  and MLflow (every process of each) hold no secret but MLflow's Flask key (docs/security.md); no worker
  holds a secret of the promoter, the admin or the databases.
- test_a_job_variable_override_cannot_act_as_the_promoter: with the Prefect auth string alone, a flow
  run on the pipeline queue with job variable `command` is refused (422); the pool's template put back
  by the same string, the command runs on the pipeline worker and its move of `champion` gets 403.
- test_up_after_down: `down` then `up` on the same directory (the cluster kept), every server answers.
- test_stack_up_refuses_...: `up --dir` a symbolic link, a directory others may write, another user's.
- test_make_prefect_server_...: `make prefect-server`'s command: 401 without the auth string, which is
  not in the server's environment (a profile in its PREFECT_HOME), telemetry off.
- test_rotate_refuses_the_old_secrets: every secret new; the old ones refused by Prefect, MLflow and
  PostgreSQL, the new ones accepted; the workers restarted with the new auth string.

Skipped only where PostgreSQL cannot be run (never under CI=true). `stack down` ends everything, also on
failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest
from flows_testkit import REPO, SERVER_START_TIMEOUT, Processes, children, clean_env, cmdline, free_port

from flows.infra import attacks, auth, stack

pytestmark = pytest.mark.slow

MODEL = "outfit-completion"


def cli(*args: str) -> str:
    proc = attacks.stack_cli(*args)
    assert proc.returncode == 0, f"stack {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def target():
    reason = stack.postgres_missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the PostgreSQL tests: {reason}")
        pytest.skip(reason)
    # The cluster runs as `postgres` under root: it must pass through the parent (not pytest's private tmp).
    parent = Path(tempfile.mkdtemp(prefix="cb-stack-up-"))
    parent.chmod(0o711)
    root = parent / "stack"
    try:
        cli("up", "--dir", str(root), "--workers", "1")
        yield attacks.Target(root)
    finally:
        attacks.stack_cli("down", "--dir", str(root))
        postmaster = root / "postgres" / "postmaster.pid"
        if postmaster.exists():  # `down` failed to stop it: not left running without its directory
            os.kill(int(postmaster.read_text().split()[0]), signal.SIGKILL)
        shutil.rmtree(parent, ignore_errors=True)


def pids(t: attacks.Target, name: str) -> list[int]:
    """The process `name` of the stack and every descendant."""
    pid = int((t.root / "pids" / f"{name}.pid").read_text())
    return [pid, *children(pid)]


def postgres_pids(t: attacks.Target) -> list[int]:
    pid = int((Path(t.info["postgres"]) / "postmaster.pid").read_text().split()[0])
    return [pid, *children(pid)]


def environ(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "environ").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def test_the_stack_files_are_private(target):
    me = os.geteuid()
    assert stat.S_IMODE(target.root.stat().st_mode) == stack.STACK_DIR_MODE
    datadir = Path(target.info["postgres"])
    seen = 0
    for path in target.root.rglob("*"):
        if datadir in path.parents:
            continue  # PostgreSQL's own (0700 itself, checked below)
        st = path.lstat()
        seen += 1
        assert not stat.S_ISLNK(st.st_mode), path
        assert st.st_mode & 0o077 == 0, f"{path}: mode {stat.S_IMODE(st.st_mode):o}"
        owner = datadir.stat().st_uid if path in (datadir, datadir.parent / f"{datadir.name}.log") else me
        assert st.st_uid == owner, path
    assert seen > 20
    for name in (
        auth.CREDENTIALS,
        auth.PGPASS,
        auth.AUTH_INI,
        auth.MLFLOW_AUTH_DB,
        "stack.json",
        "logs",
        "mlartifacts",
    ):
        assert (target.root / name).exists(), name


def test_no_secret_in_a_server_environment(target):
    creds = target.creds
    flask_key = creds["MLFLOW_FLASK_SERVER_SECRET_KEY"]
    servers = {
        "postgres": postgres_pids(target),
        "prefect-server": pids(target, "prefect-server"),
        "mlflow-server": pids(target, "mlflow-server"),
    }
    assert all(len(p) >= 1 for p in servers.values()) and len(servers["postgres"]) > 1
    for name, procs in servers.items():
        for pid in procs:
            env, cmd = environ(pid), cmdline(pid)
            # MLflow 3.17 reads its Flask key from the environment only (docs/security.md).
            found = [k for k, v in creds.items() if v in env and v != flask_key] + [
                k for k, v in creds.items() if v in cmd
            ]
            assert not found, f"{name} (pid {pid}) holds {found}"
    assert any(flask_key in environ(p) for p in servers["mlflow-server"])
    assert "PGPASSWORD" not in " ".join(environ(p) for p in servers["postgres"])

    # The workers are the trainer's plane: the auth string and the trainer's password, nothing more.
    allowed = {"PREFECT_AUTH_STRING", "MLFLOW_TRAINER_PASSWORD"}
    for name in ("worker-pipeline", "worker-1"):
        for pid in pids(target, name):
            env = environ(pid)
            held = {k for k, v in creds.items() if v in env}
            assert held <= allowed, f"{name} (pid {pid}) holds {sorted(held - allowed)}"


def test_a_job_variable_override_cannot_act_as_the_promoter(target):
    outcomes = attacks.job_variable_override(target, MODEL)
    observed = {o.tried.split(":")[0]: o.observed for o in outcomes}
    report = "\n".join(f"{o.tried}: {o.observed}" for o in outcomes)
    assert observed["flow run on the pipeline queue with job variable `command`"] == "HTTP 422", report
    # Put back by the auth string, the template lets the command run: as trainer, refused.
    assert observed["pool template reset by the auth string, command run by the pipeline worker"] == (
        "ran as MLflow user 'trainer': HTTP 403"
    ), report
    assert all(o.refused for o in outcomes if o.tried.startswith("champion")), report


def test_up_after_down(target):
    cli("down", "--dir", str(target.root))
    assert not (target.root / "stack.json").exists()
    cli("up", "--dir", str(target.root), "--workers", "1")
    creds = target.creds
    code, _ = attacks.http("POST", f"{target.api}/flows/filter", json={}, auth=attacks.prefect_auth(creds))
    assert code == 200
    code, _ = attacks.http(
        "GET",
        f"{target.mlflow}/api/2.0/mlflow/registered-models/get",
        params={"name": MODEL},
        auth=("trainer", creds["MLFLOW_TRAINER_PASSWORD"]),
    )
    assert code == 200  # the registry of before the restart


def workers_online_since(t: attacks.Target, since: float, timeout: float = 180) -> set[str]:
    """The cpu pool's workers that sent a heartbeat after `since` (epoch seconds), waiting for both."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    settings = {PREFECT_API_URL: t.api, PREFECT_API_AUTH_STRING: t.creds["PREFECT_AUTH_STRING"]}
    deadline = time.monotonic() + timeout
    fresh: set[str] = set()
    with temporary_settings(updates=settings), get_client(sync_client=True) as client:
        while time.monotonic() < deadline and fresh != {"worker-pipeline", "worker-1"}:
            workers = client.read_workers_for_work_pool("cpu")
            fresh = {w.name for w in workers if w.last_heartbeat_time and w.last_heartbeat_time.timestamp() > since}
            time.sleep(3)
    return fresh


def test_rotate_refuses_the_old_secrets(target):
    old = target.creds
    started = time.time()
    cli("rotate", "--dir", str(target.root))
    new = target.creds
    assert set(new) == set(old) and not set(new.values()) & set(old.values())

    for outcome in attacks.credential_attacks(target, old, "old secrets after rotate"):
        assert outcome.refused, outcome
    code, _ = attacks.http("POST", f"{target.api}/flows/filter", json={}, auth=attacks.prefect_auth(new))
    assert code == 200
    for user in ("admin", *auth.MLFLOW_USERS):
        code, _ = attacks.http(
            "GET",
            f"{target.mlflow}/api/2.0/mlflow/experiments/search",
            params={"max_results": 1},
            auth=(user, new[f"MLFLOW_{user.upper()}_PASSWORD"]),
        )
        assert code == 200, user
    nowhere = target.root / "no-such-pgpass"
    port = target.info["postgres_port"]
    assert attacks.postgres_login(port, "postgres", new["POSTGRES_PASSWORD"], nowhere) == "connected"
    for role in stack.DB_ROLES:
        assert attacks.postgres_login(port, role, new[f"{role.upper()}_DB_PASSWORD"], nowhere) == "connected"
    assert workers_online_since(target, started) == {"worker-pipeline", "worker-1"}
    for name in ("worker-pipeline", "worker-1"):
        assert new["PREFECT_AUTH_STRING"] in environ(pids(target, name)[0])


def test_stack_up_refuses_a_link_a_shared_or_a_foreign_directory(tmp_path):
    outcomes = attacks.foreign_directories(tmp_path)
    assert len(outcomes) == (3 if os.geteuid() == 0 else 2)
    for outcome in outcomes:
        assert outcome.refused, outcome


def test_make_prefect_server_needs_the_auth_string(tmp_path):
    port, home, secrets_dir = free_port(), tmp_path / "prefect-home", tmp_path / "secrets"
    processes = Processes(tmp_path / "logs")
    command = [sys.executable, "-m", "flows.infra.stack", "prefect-server", "--prefect-home", str(home)]
    try:
        proc = processes.start(
            "prefect-server", [*command, "--dir", str(secrets_dir), "--port", str(port)], REPO, clean_env()
        )
        api = f"http://127.0.0.1:{port}/api"
        stack.wait_healthy(f"{api}/health", 4 * SERVER_START_TIMEOUT, "prefect server", proc.alive)
        creds = auth.read_env_file(secrets_dir / auth.CREDENTIALS)
        assert attacks.http("POST", f"{api}/flows/filter", json={})[0] == 401
        assert attacks.http("POST", f"{api}/flows/filter", json={}, auth=attacks.prefect_auth(creds))[0] == 200
        env = environ(proc.popen.pid)
        assert creds["PREFECT_AUTH_STRING"] not in env and "PREFECT_SERVER_ANALYTICS_ENABLED=false" in env
        assert stat.S_IMODE((home / "profiles.toml").stat().st_mode) == 0o600
    finally:
        processes.stop_all()
