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

Files (docs/security.md): the stack trusts a directory or secret file only when it is no symbolic link, is
owned by the user who runs it and is writable by no one else; files are read with O_NOFOLLOW and written
as a new file (O_EXCL, 0600) renamed over the old, so nothing is written through a link someone planted.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

CREDENTIALS = "credentials.env"
PGPASS = "pgpass"
AUTH_INI = "basic_auth.ini"
MLFLOW_AUTH_DB = "mlflow-auth.db"
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


def refuse(path: Path, why: str) -> SystemExit:
    """The one-line error for a path the stack will not trust."""
    return SystemExit(f"{path}: {why}; refused (docs/security.md)")


def _check_owned(path: Path, st: os.stat_result, what: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise refuse(path, "a symbolic link")
    if st.st_uid != os.geteuid():
        raise refuse(path, f"{what} owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")


def private_dir(path: Path, mode: int = 0o700) -> Path:
    """`path` as a directory of this user's that no one else may write: created with `mode`, or an
    existing one checked (no symbolic link, owned by this user, writable by no one else, so nobody can
    have planted a file in it) and set to `mode`."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        st = os.lstat(path)
        _check_owned(path, st, "a directory")
        if not stat.S_ISDIR(st.st_mode):
            raise refuse(path, "not a directory") from None
        if st.st_mode & 0o022:
            raise refuse(path, f"writable by others (mode {st.st_mode & 0o777:o})") from None
    os.chmod(path, mode, follow_symlinks=False)
    return path


def read_private(path: Path) -> str:
    """The text of a secret file: refused when it is a symbolic link, not this user's or readable by others."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise refuse(path, "a symbolic link") from None
        raise SystemExit(f"{path}: {exc.strerror}") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        _check_owned(path, st, "a file")
        if not stat.S_ISREG(st.st_mode):
            raise refuse(path, "not a regular file")
        if st.st_mode & 0o077:
            raise SystemExit(f"{path}: readable by others (mode {st.st_mode & 0o777:o}); chmod 600 it")
        return f.read()


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only: a new file (O_EXCL, never through a link or a
    file someone else made, never briefly readable by others) renamed over whatever was there."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_log(path: Path):
    """A log file to append to (0600, never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise refuse(path, f"a log owned by uid {st.st_uid}, not by this user")
    os.fchmod(fd, 0o600)  # a log of an older stack may be 0644
    return os.fdopen(fd, "ab")


def read_env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in read_private(path).splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


class Secrets(dict):
    """The secrets as a dict whose repr shows only the keys (tracebacks and test reports print reprs)."""

    def __repr__(self) -> str:
        return f"Secrets({sorted(self)})"


def new_secrets() -> dict[str, str]:
    """A fresh value for every key (the first `up`, and `stack rotate`)."""
    return Secrets({k: _new(k) for k in KEYS})


def write_credentials(root: Path, values: dict[str, str]) -> None:
    lines = ["# contextual-bert stack secrets: never commit, never paste (docs/security.md, rotation)"]
    lines += [f"# {KEYS.get(k, '')}\n{k}={values[k]}" for k in values]
    write_private(root / CREDENTIALS, "\n".join(lines) + "\n")


def credentials(root: Path, dir_mode: int = 0o700) -> dict[str, str]:
    """The stack's secrets from <root>/credentials.env; created at the first call, keys missing from an
    older file added. Refuses a directory or file that is a symbolic link, another user's, or open to others."""
    path = root / CREDENTIALS
    private_dir(root, dir_mode)
    values = read_env_file(path) if os.path.lexists(path) else {}
    missing = [k for k in KEYS if not values.get(k)]
    if missing:
        values.update({k: _new(k) for k in missing})
        write_credentials(root, values)
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
    write_private(
        path,
        "\n".join(
            [
                "[mlflow]",
                "default_permission = READ",
                f"database_uri = sqlite:///{(root / MLFLOW_AUTH_DB).resolve()}",
                "admin_username = admin",
                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth",
                "grant_default_workspace_access = false",
                # A password check is PBKDF2 (seconds on a loaded machine, on every request of every training):
                # cached 60 s per (user, password). One worker process, so a password change applies at once.
                "auth_cache_ttl_seconds = 60",
            ]
        )
        + "\n",
    )
    return path


def set_mlflow_admin(root: Path, creds: dict[str, str]) -> None:
    """User admin in the auth app's database, with the file's password, written before the server starts:
    so the password never has to be in the server's environment (MLFLOW_AUTH_ADMIN_PASSWORD)."""
    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore()
    store.init_db(f"sqlite:///{(root / MLFLOW_AUTH_DB).resolve()}")
    if store.has_user("admin", use_primary=True):
        store.update_user("admin", password=creds["MLFLOW_ADMIN_PASSWORD"])
    else:
        store.create_user("admin", creds["MLFLOW_ADMIN_PASSWORD"], is_admin=True)
    store.engine.dispose()


def prefect_server_env(creds: dict[str, str]) -> dict[str, str]:
    # The server's own services call its API too: they read server.api.auth_string.
    return {"PREFECT_SERVER_API_AUTH_STRING": creds["PREFECT_AUTH_STRING"]}


def prefect_client_env(creds: dict[str, str]) -> dict[str, str]:
    return {"PREFECT_API_AUTH_STRING": creds["PREFECT_AUTH_STRING"]}


def mlflow_server_env(root: Path, creds: dict[str, str]) -> dict[str, str]:
    """No admin password (set_mlflow_admin writes the user first). The Flask key stays: MLflow 3.17 reads
    it only from the environment (docs/security.md)."""
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(write_auth_ini(root)),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": creds["MLFLOW_FLASK_SERVER_SECRET_KEY"],
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
        grant = {"username": user, "resource_type": kind, "resource_id": resource, "permission": permission}
        path = "/api/3.0/mlflow/users/permissions/grant"
        got = _call(uri, admin, "POST", path, ok=(200, 400), json=grant)
        if got.get("error_code") == "RESOURCE_ALREADY_EXISTS":  # a restart: the grant set anew, as listed here
            revoke = {k: v for k, v in grant.items() if k != "permission"}
            _call(uri, admin, "POST", "/api/3.0/mlflow/users/permissions/revoke", json=revoke)
            _call(uri, admin, "POST", path, json=grant)
        elif "error_code" in got:
            raise RuntimeError(f"MLflow POST {path}: {got['error_code']} {got.get('message', '')[:300]}")
