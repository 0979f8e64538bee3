"""The stack's secrets and who may do what (flows/infra/stack.py, docs/scaling.md).

One file holds every secret the stack uses: <dir>/credentials.env (mode 0600, outside git: .stack/ is
ignored), generated at the first `up` and read by every process the stack starts. Nothing here writes a
secret anywhere else, except the PostgreSQL password file (<dir>/pgpass, 0600) that libpq and asyncpg
read, so no connection string carries a password.

Users of the MLflow server (the `contextual-bert-auth` app: MLflow's basic-auth app plus one rule, see
contextual_bert.registry.auth_app):
- admin: everything; its password is set at the first start (MLflow 3.17 has no default password).
- trainer: logs runs, registers versions (EDIT on the experiment and the registered model).
- promoter: the same, and MANAGE on the registered model: the only user (besides admin) that may move
  the aliases 'champion' and 'previous'.
Every authenticated user reads everything (default_permission READ); an unauthenticated request gets 401.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

CREDENTIALS = "credentials.env"
PGPASS = "pgpass"
AUTH_INI = "basic_auth.ini"
MLFLOW_APP = "contextual-bert-auth"  # the entry point in pyproject.toml
PREFECT_USER = "prefect"  # the user part of the Prefect auth string (the server checks the whole string)
MLFLOW_USERS = ("trainer", "promoter")
# name in the file -> what it is
KEYS = {
    "POSTGRES_PASSWORD": "PostgreSQL superuser 'postgres'",
    "PREFECT_DB_PASSWORD": "PostgreSQL role 'prefect' (the Prefect server's database)",
    "MLFLOW_DB_PASSWORD": "PostgreSQL role 'mlflow' (the MLflow server's database)",
    "PREFECT_AUTH_STRING": "Prefect server.api.auth_string / client api.auth_string",
    "MLFLOW_FLASK_SERVER_SECRET_KEY": "MLflow auth app's session / CSRF key",
    "MLFLOW_ADMIN_PASSWORD": "MLflow user 'admin'",
    "MLFLOW_TRAINER_PASSWORD": "MLflow user 'trainer'",
    "MLFLOW_PROMOTER_PASSWORD": "MLflow user 'promoter'",
    "SERVING_TOKEN": "bearer token of the serving gate (contextual_bert.serving.gate)",
}


def _new(key: str) -> str:
    value = secrets.token_urlsafe(24)
    return f"{PREFECT_USER}:{value}" if key == "PREFECT_AUTH_STRING" else value


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only, never briefly by others."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    path.chmod(0o600)  # an existing file keeps its mode on open


def read_env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


class Secrets(dict):
    """The secrets as a dict whose repr shows only the keys (tracebacks and test reports print reprs)."""

    def __repr__(self) -> str:
        return f"Secrets({sorted(self)})"


def credentials(root: Path) -> dict[str, str]:
    """The stack's secrets from <root>/credentials.env; created at the first call, keys missing from an
    older file added. Refuses a file others may read."""
    path = root / CREDENTIALS
    root.mkdir(parents=True, exist_ok=True)
    values = {}
    if path.exists():
        if path.stat().st_mode & 0o077:
            raise SystemExit(f"{path}: readable by others (mode {path.stat().st_mode & 0o777:o}); chmod 600 it")
        values = read_env_file(path)
    missing = [k for k in KEYS if not values.get(k)]
    if missing:
        values.update({k: _new(k) for k in missing})
        lines = ["# contextual-bert stack secrets: never commit, never paste (docs/scaling.md, rotation)"]
        lines += [f"# {KEYS.get(k, '')}\n{k}={values[k]}" for k in values]
        write_private(path, "\n".join(lines) + "\n")
    return Secrets(values)


def write_pgpass(root: Path, port: int, creds: dict[str, str]) -> Path:
    """<root>/pgpass for libpq (psycopg2) and asyncpg: the servers' URLs then carry no password."""
    path = root / PGPASS
    write_private(
        path,
        "".join(f"127.0.0.1:{port}:{db}:{db}:{creds[f'{db.upper()}_DB_PASSWORD']}\n" for db in ("prefect", "mlflow")),
    )
    return path


def write_auth_ini(root: Path) -> Path:
    """The MLflow auth app's config: its user database in the stack directory."""
    path = root / AUTH_INI
    path.write_text(
        "\n".join(
            [
                "[mlflow]",
                "default_permission = READ",
                f"database_uri = sqlite:///{(root / 'mlflow-auth.db').resolve()}",
                "admin_username = admin",
                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth",
                "grant_default_workspace_access = false",
                # A password check is PBKDF2 (seconds on a loaded machine, on every request of every training):
                # cached 60 s per (user, password). One worker process, so a password change applies at once.
                "auth_cache_ttl_seconds = 60",
            ]
        )
        + "\n"
    )
    return path


def prefect_server_env(creds: dict[str, str]) -> dict[str, str]:
    # The server's own services call its API too: they read server.api.auth_string.
    return {"PREFECT_SERVER_API_AUTH_STRING": creds["PREFECT_AUTH_STRING"]}


def prefect_client_env(creds: dict[str, str]) -> dict[str, str]:
    return {"PREFECT_API_AUTH_STRING": creds["PREFECT_AUTH_STRING"]}


def mlflow_server_env(root: Path, creds: dict[str, str]) -> dict[str, str]:
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(write_auth_ini(root)),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": creds["MLFLOW_FLASK_SERVER_SECRET_KEY"],
        # read only while the auth database has no admin yet (the first start)
        "MLFLOW_AUTH_ADMIN_PASSWORD": creds["MLFLOW_ADMIN_PASSWORD"],
    }


def mlflow_user_env(creds: dict[str, str], user: str) -> dict[str, str]:
    return {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": creds[f"MLFLOW_{user.upper()}_PASSWORD"]}


def _call(uri: str, auth: tuple[str, str], method: str, path: str, ok=(200,), **kwargs) -> dict:
    import requests

    resp = requests.request(method, f"{uri}{path}", auth=auth, timeout=30, **kwargs)
    if resp.status_code not in ok:
        # the body names the error; the request (which holds passwords) is not repeated
        raise RuntimeError(f"MLflow {method} {path}: HTTP {resp.status_code} {resp.text[:300]}")
    return resp.json() if resp.content else {}


def setup_mlflow(uri: str, creds: dict[str, str], experiment: str, model_name: str) -> None:
    """Users trainer and promoter, the experiment and the registered model created by admin (a user who
    creates a registered model gets MANAGE on it: the trainer must not be its creator), and the grants."""
    admin = ("admin", creds["MLFLOW_ADMIN_PASSWORD"])
    for user in MLFLOW_USERS:
        password = creds[f"MLFLOW_{user.upper()}_PASSWORD"]
        got = _call(uri, admin, "GET", "/api/2.0/mlflow/users/get", ok=(200, 404), params={"username": user})
        if "user" not in got:
            _call(uri, admin, "POST", "/api/2.0/mlflow/users/create", json={"username": user, "password": password})
        else:  # the file is the truth: a password changed there is set here (rotation)
            _call(
                uri,
                admin,
                "PATCH",
                "/api/2.0/mlflow/users/update-password",
                json={"username": user, "password": password},
            )
    got = _call(
        uri,
        admin,
        "GET",
        "/api/2.0/mlflow/experiments/get-by-name",
        ok=(200, 404),
        params={"experiment_name": experiment},
    )
    if "experiment" in got:
        experiment_id = got["experiment"]["experiment_id"]
    else:
        experiment_id = _call(uri, admin, "POST", "/api/2.0/mlflow/experiments/create", json={"name": experiment})[
            "experiment_id"
        ]
    got = _call(uri, admin, "GET", "/api/2.0/mlflow/registered-models/get", ok=(200, 404), params={"name": model_name})
    if "registered_model" not in got:
        _call(uri, admin, "POST", "/api/2.0/mlflow/registered-models/create", json={"name": model_name})
    grants = [
        ("trainer", "experiment", experiment_id, "EDIT"),
        ("trainer", "registered_model", model_name, "EDIT"),
        ("promoter", "experiment", experiment_id, "EDIT"),
        ("promoter", "registered_model", model_name, "MANAGE"),
    ]
    for user, kind, resource, permission in grants:
        _call(
            uri,
            admin,
            "POST",
            "/api/3.0/mlflow/users/permissions/grant",
            json={"username": user, "resource_type": kind, "resource_id": resource, "permission": permission},
        )
