"""The attacks a stack started by `python -m flows.infra.stack up` must refuse (issue 90, docs/security.md).

Each attack returns `Outcome`s: what was tried, what came back (a status, an error class: never a secret)
and whether it was refused. tests/flows/infra/test_stack_up.py asserts them, benchmarks/security_attacks.py
records them. They need a running stack (`Target`: its directory) and the `postgres` extra.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from flows.infra import auth
from flows.infra.work_pools import CPU_POOL, PIPELINE_QUEUE

CHAMPION = "champion"
SECRETS_MARK = "contextual-bert stack secrets"  # credentials.env's first line: a read of the file shows it


@dataclass
class Outcome:
    attack: str
    tried: str
    observed: str
    refused: bool

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Target:
    root: Path

    @property
    def info(self) -> dict:
        return json.loads(auth.read_private(self.root / "stack.json"))

    @property
    def creds(self) -> dict[str, str]:
        return auth.read_env_file(self.root / auth.CREDENTIALS)

    @property
    def api(self) -> str:
        return self.info["PREFECT_API_URL"]

    @property
    def mlflow(self) -> str:
        return self.info["MLFLOW_TRACKING_URI"]


def http(method: str, url: str, **kwargs) -> tuple[int, str]:
    import requests

    resp = requests.request(method, url, timeout=30, **kwargs)
    return resp.status_code, resp.text


def _http(attack: str, tried: str, method: str, url: str, refused_by=(401,), **kwargs) -> Outcome:
    code, _ = http(method, url, **kwargs)
    return Outcome(attack, tried, f"HTTP {code}", code in refused_by)


def prefect_auth(creds: dict[str, str]) -> tuple[str, str]:
    user, password = creds["PREFECT_AUTH_STRING"].split(":", 1)
    return user, password


def websocket(api: str, token: str | None, subprotocol: bool) -> str:
    """How Prefect's events websocket answers: 'HTTP <code>' (handshake refused), 'closed <code>' (closed
    after the handshake) or 'accepted'."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect
    from websockets.typing import Subprotocol

    try:
        with connect(
            api.replace("http://", "ws://") + "/events/in",
            subprotocols=[Subprotocol("prefect")] if subprotocol else None,
            open_timeout=30,
        ) as ws:
            ws.send(json.dumps({"type": "auth", "token": token}))
            reply = json.loads(ws.recv(timeout=30))
            return "accepted" if reply == {"type": "auth_success"} else f"answered {reply.get('type')}"
    except InvalidStatus as exc:
        return f"HTTP {exc.response.status_code}"
    except ConnectionClosed as exc:
        return f"closed {exc.rcvd.code if exc.rcvd else 'without a code'}"


def websocket_refused(observed: str) -> bool:
    """Refused by status: a handshake answered 401/403, or a close with 1008 (policy) or 1002 (protocol);
    a timeout or any other error counts as not refused."""
    return observed in ("HTTP 401", "HTTP 403", "closed 1008", "closed 1002")


def dribble_body(address: tuple[str, int], token: str, bound_s: float) -> tuple[str, float]:
    """A POST to the gate whose body never comes (a byte at a time, Content-Length 1000): the status line the
    gate answers with (or "no answer") and the seconds it took; the gate must close it with 408."""
    head = (
        "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: 1000\r\n\r\n"
    )
    answer, started = b"", time.monotonic()
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(head.encode())
        sock.settimeout(0.3)
        while time.monotonic() - started < bound_s and b"\r\n\r\n" not in answer:
            try:
                sock.sendall(b" ")
                answer += sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
    return answer.split(b"\r\n", 1)[0].decode("latin-1") or "no answer", time.monotonic() - started


def postgres_login(port: int, user: str, password: str | None, nowhere: Path) -> str:
    import psycopg2

    try:
        psycopg2.connect(
            host="127.0.0.1",
            port=port,
            user=user,
            dbname=user,
            password=password,
            passfile=str(nowhere),  # neither the stack's pgpass nor ~/.pgpass
            connect_timeout=10,
        ).close()
        return "connected"
    except psycopg2.OperationalError as exc:
        return "refused: password authentication failed" if "password" in str(exc) else f"error: {exc}"[:200]


def credential_attacks(t: Target, creds: dict[str, str], label: str) -> list[Outcome]:
    """Every server with `creds` (none, wrong or old ones: `label` says which); each must refuse."""
    out = []
    prefect = prefect_auth(creds) if creds else None
    for path in ("/flows/filter", "/deployments/filter", "/work_pools/filter"):
        out.append(_http(label, f"Prefect POST {path}", "POST", f"{t.api}{path}", json={}, auth=prefect))
    observed = websocket(t.api, None, subprotocol=False)
    out.append(
        Outcome(
            label,
            "Prefect websocket /events/in without the 'prefect' subprotocol",
            observed,
            websocket_refused(observed),
        )
    )
    observed = websocket(t.api, creds.get("PREFECT_AUTH_STRING"), subprotocol=True)
    out.append(Outcome(label, "Prefect websocket /events/in, auth message", observed, websocket_refused(observed)))
    for user in ("admin", *auth.MLFLOW_USERS):
        basic = (user, creds[f"MLFLOW_{user.upper()}_PASSWORD"]) if creds else None
        out.append(
            _http(
                label,
                f"MLflow GET experiments/search as {user}",
                "GET",
                f"{t.mlflow}/api/2.0/mlflow/experiments/search",
                params={"max_results": 1},
                auth=basic,
            )
        )
    nowhere = t.root / "no-such-pgpass"
    for user in ("postgres", "prefect", "mlflow"):
        key = "POSTGRES_PASSWORD" if user == "postgres" else f"{user.upper()}_DB_PASSWORD"
        observed = postgres_login(t.info["postgres_port"], user, creds.get(key), nowhere)
        out.append(Outcome(label, f"PostgreSQL login as {user}", observed, observed.startswith("refused")))
    return out


def wrong(creds: dict[str, str]) -> dict[str, str]:
    """The same keys, each value wrong."""
    return {
        k: (f"{auth.PREFECT_USER}:wrong" if k == "PREFECT_AUTH_STRING" else "wrong-" + v[:4]) for k, v in creds.items()
    }


# --- job-variable override: code on the promoter's queue (issue 90, finding 1) -------------------------

ATTACK_SCRIPT = """
import json, os, sys, requests
uri, name, version, out = sys.argv[1:5]
user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
resp = requests.post(f"{uri}/api/2.0/mlflow/registered-models/alias", auth=(user, password) if user else None,
                     json={"name": name, "alias": "champion", "version": version}, timeout=30)
try:
    creds_readable = "contextual-bert stack secrets" in open(sys.argv[5]).read()
except OSError:
    creds_readable = False
with open(out, "w") as f:
    json.dump({"user": user, "status": resp.status_code, "credentials_readable": creds_readable}, f)
"""


def registered_versions(t: Target, model: str, n: int = 2) -> list[str]:
    """At least `n` versions of registered model `model` (made by admin when missing; their runs are
    empty) and `champion` on the first: what the override attack tries to move."""
    from flows.infra.auth import _call

    admin = ("admin", t.creds["MLFLOW_ADMIN_PASSWORD"])
    got = _call(t.mlflow, admin, "GET", "/api/2.0/mlflow/model-versions/search", params={"filter": f"name='{model}'"})
    versions = sorted((v["version"] for v in got.get("model_versions", [])), key=int)
    if len(versions) < n:
        exp = _call(
            t.mlflow,
            admin,
            "GET",
            "/api/2.0/mlflow/experiments/get-by-name",
            params={"experiment_name": "contextual-bert"},
        )
        for _ in range(n - len(versions)):
            run = _call(
                t.mlflow,
                admin,
                "POST",
                "/api/2.0/mlflow/runs/create",
                json={"experiment_id": exp["experiment"]["experiment_id"]},
            )
            run_id = run["run"]["info"]["run_id"]
            made = _call(
                t.mlflow,
                admin,
                "POST",
                "/api/2.0/mlflow/model-versions/create",
                json={"name": model, "source": f"runs:/{run_id}/model", "run_id": run_id},
            )
            versions.append(made["model_version"]["version"])
    _call(
        t.mlflow,
        admin,
        "POST",
        "/api/2.0/mlflow/registered-models/alias",
        json={"name": model, "alias": CHAMPION, "version": versions[0]},
    )
    return versions


def champion(t: Target, model: str) -> str:
    from flows.infra.auth import _call

    got = _call(
        t.mlflow,
        ("admin", t.creds["MLFLOW_ADMIN_PASSWORD"]),
        "GET",
        "/api/2.0/mlflow/registered-models/alias",
        params={"name": model, "alias": CHAMPION},
    )
    return got["model_version"]["version"]


def job_variable_override(t: Target, model: str, timeout: float = 300) -> list[Outcome]:
    """With the Prefect auth string alone (which every worker and training holds): a flow run on the
    pipeline queue whose job variable `command` runs a script that moves `champion` with the MLflow
    credentials of the worker that runs it. Then, as the string also allows, the pool's template put
    back to Prefect's default, and the same again: the script runs, and must get 403."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolUpdate
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings
    from prefect.workers.process import ProcessWorker

    from flows.infra.work_pools import locked_job_template

    versions = registered_versions(t, model)
    before = champion(t, model)
    other = next(v for v in versions if v != before)
    # Where the worker (another directory, maybe another user) can read the script and write its report.
    work = Path(tempfile.mkdtemp(prefix="cb-attack-"))
    work.chmod(0o755)
    script, report = work / "attack.py", work / "report.json"
    script.write_text(ATTACK_SCRIPT)
    command = " ".join(
        [sys.executable, str(script), t.mlflow, model, other, str(report), str(t.root / auth.CREDENTIALS)]
    )
    out = []
    settings = {PREFECT_API_URL: t.api, PREFECT_API_AUTH_STRING: t.creds["PREFECT_AUTH_STRING"]}
    with temporary_settings(updates=settings), get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("attack")
        deployment_id = client.create_deployment(
            flow_id=flow_id,
            name=f"attack-{os.getpid()}-{int(time.time())}",
            work_pool_name=CPU_POOL,
            work_queue_name=PIPELINE_QUEUE,
            entrypoint="attack.py:attack",
            path=str(work),
        )
        try:
            client.create_flow_run_from_deployment(deployment_id, job_variables={"command": command})
            observed, refused = "flow run created", False
            _wait_for(report, timeout)
        except PrefectHTTPStatusError as exc:
            observed, refused = f"HTTP {exc.response.status_code}", exc.response.status_code == 422
        out.append(
            Outcome(
                "job-variable override", "flow run on the pipeline queue with job variable `command`", observed, refused
            )
        )
        after_first = champion(t, model)
        out.append(
            Outcome(
                "job-variable override",
                "champion after the first try",
                f"version {after_first} (was {before})",
                after_first == before,
            )
        )

        # The auth string may also rewrite the pool: the command then runs; what may it do?
        locked = client.read_work_pool(CPU_POOL).base_job_template
        client.update_work_pool(
            CPU_POOL, WorkPoolUpdate(base_job_template=ProcessWorker.get_default_base_job_template())
        )
        try:
            report.unlink(missing_ok=True)
            client.create_flow_run_from_deployment(deployment_id, job_variables={"command": command})
            _wait_for(report, timeout)
        finally:
            client.update_work_pool(CPU_POOL, WorkPoolUpdate(base_job_template=locked or locked_job_template()))
            client.delete_deployment(deployment_id)
    ran = json.loads(report.read_text()) if report.exists() else {}
    shutil.rmtree(work, ignore_errors=True)
    out.append(
        Outcome(
            "job-variable override",
            "pool template reset by the auth string, command run by the pipeline worker: move champion with its MLflow user",
            f"ran as MLflow user {ran.get('user')!r}: HTTP {ran.get('status')}" if ran else "the command did not run",
            ran.get("status") in (401, 403),
        )
    )
    after = champion(t, model)
    out.append(
        Outcome("job-variable override", "champion afterwards", f"version {after} (was {before})", after == before)
    )
    out.append(
        Outcome(
            "job-variable override",
            "the same command reads the stack's credentials.env (same Unix user on one machine: docs/security.md)",
            "read" if ran.get("credentials_readable") else "not readable",
            not ran.get("credentials_readable", True),
        )
    )
    return out


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not path.exists():
        time.sleep(2)


# --- traversal: paths that would leave the servers' roots -----------------------------------------------


def traversal(t: Target) -> list[Outcome]:
    """With valid credentials (trainer, the auth string): paths that climb out of MLflow's artifact root or
    Prefect's static files towards credentials.env. Refused when nothing of the file comes back."""
    creds = t.creds
    trainer = ("trainer", creds["MLFLOW_TRAINER_PASSWORD"])
    prefect = prefect_auth(creds)
    base = t.api.removesuffix("/api")
    up = "..%2F" * 2
    tries = [
        ("MLflow artifacts API", f"{t.mlflow}/api/2.0/mlflow-artifacts/artifacts/{up}{auth.CREDENTIALS}", trainer),
        ("MLflow artifacts API", f"{t.mlflow}/api/2.0/mlflow-artifacts/artifacts/%2E%2E/{auth.CREDENTIALS}", trainer),
        (
            "MLflow artifacts API, absolute",
            f"{t.mlflow}/api/2.0/mlflow-artifacts/artifacts/{t.root / auth.CREDENTIALS}",
            trainer,
        ),
        ("MLflow static files", f"{t.mlflow}/static-files/{up}{up}{auth.CREDENTIALS}", trainer),
        ("MLflow get-artifact", f"{t.mlflow}/get-artifact?path={up}{up}{auth.CREDENTIALS}&run_uuid=0", trainer),
        ("Prefect UI static", f"{base}/{up}{up}{auth.CREDENTIALS}", prefect),
        ("Prefect API static", f"{t.api}/static/{up}{up}{auth.CREDENTIALS}", prefect),
    ]
    out = []
    for what, url, who in tries:
        code, body = http("GET", url, auth=who)
        leaked = SECRETS_MARK in body or any(v in body for v in creds.values())
        out.append(
            Outcome("traversal", f"{what}: {url.split('//', 1)[1].split('/', 1)[1][:80]}", f"HTTP {code}", not leaked)
        )
    return out


# --- the stack's own directory (issue 90, finding 4) ---------------------------------------------------


def stack_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    repo = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-m", "flows.infra.stack", *args],
        cwd=repo,
        env={k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
    )


def foreign_directories(scratch: Path) -> list[Outcome]:
    """`stack up --dir` a symbolic link, a directory of another user with a credentials.env of its own, and
    a directory others may write: each refused with one line, nothing written."""
    out = []
    real = auth.private_dir(scratch / "real")
    (scratch / "link").symlink_to(real)
    cases = [("a symbolic link to a directory", scratch / "link", real)]
    shared = scratch / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    cases.append(("a directory others may write", shared, shared))
    if os.geteuid() == 0:  # only root can give a directory away
        theirs = scratch / "theirs"
        theirs.mkdir(mode=0o755)
        planted = theirs / auth.CREDENTIALS
        planted.write_text("PLANTED=1\n")
        planted.chmod(0o600)
        for p in (theirs, planted):
            os.chown(p, 65534, 65534)
        cases.append(("a directory of another user, its own credentials.env in it", theirs, theirs))
    for what, given, inside in cases:
        before = sorted(p.name for p in inside.iterdir())
        proc = stack_cli("up", "--dir", str(given), "--workers", "1", timeout=120)
        lines = proc.stdout.strip().splitlines()
        after = sorted(p.name for p in inside.iterdir())
        refused = proc.returncode != 0 and len(lines) == 1 and "refused" in lines[0] and before == after
        out.append(Outcome("stack directory", what, lines[-1][:200] if lines else f"exit {proc.returncode}", refused))
    return out
