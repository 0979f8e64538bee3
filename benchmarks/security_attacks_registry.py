"""The registry's and the serving gate's part of the attack set of issue 90: what a trainer (or any client of
the gate) tries against them, each refused or detected before anything is served.

`ATTACKS` is a list of functions `attack(stack) -> {"name", "expected", "observed", "refused": bool}`, imported
by benchmarks/security_attacks.py, which runs the whole set against a stack started with
`python -m flows.infra.stack up` and writes the results. `REGISTRY_ATTACKS` need only the MLflow server;
`GATE_ATTACKS` need a running serving gate.

`stack` (an object with these attributes, or a dict with these keys) must provide:
- `mlflow_uri`: the MLflow server's URL (stack.json's MLFLOW_TRACKING_URI);
- `passwords`: {"admin": ..., "trainer": ..., "promoter": ...}, the MLflow users' passwords
  (credentials.env's MLFLOW_ADMIN_PASSWORD, MLFLOW_TRAINER_PASSWORD, MLFLOW_PROMOTER_PASSWORD);
- `model_name`: the registered model (params.yaml's mlflow.model_name), holding at least one version
  registered by `contextual-bert register` (run the pipeline once first);
- `gate_url`: the gate's base URL (http://127.0.0.1:<port>), with `serving_token` (credentials.env's
  SERVING_TOKEN) and, optionally, `gate_timeout_s`: the larger of its --header-timeout and --body-timeout
  (default 30, the gate's default body timeout; its header timeout is 10).

`stack_from_dir(root, gate_url)` builds it from a stack directory. The attacks import `contextual_bert` (the
digest check is the loader's own, registry/integrity.py): run them with the project's venv.

The artifact attack changes a registered version's code file on the server and puts it back (as the promoter)
before it returns: run it against a stack where nothing restarts the gate meanwhile.

    python benchmarks/security_attacks_registry.py [.stack] [http://127.0.0.1:5001]   # prints the results
"""

from __future__ import annotations

import json
import socket
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import requests

TIMEOUT = 30


def _get(stack, key: str, default=None):
    return stack.get(key, default) if isinstance(stack, dict) else getattr(stack, key, default)


def _result(name: str, expected: str, observed: str, refused: bool) -> dict:
    return {"name": name, "expected": expected, "observed": observed, "refused": bool(refused)}


def _mlflow(stack, user: str, method: str, path: str, **kwargs) -> requests.Response:
    auth = (user, _get(stack, "passwords")[user])
    return requests.request(method, f"{_get(stack, 'mlflow_uri')}{path}", auth=auth, timeout=TIMEOUT, **kwargs)


def _target(stack):
    """The version attacked: the champion, else the newest version; as the promoter sees it."""
    name = _get(stack, "model_name")
    found = _mlflow(
        stack, "promoter", "GET", "/api/2.0/mlflow/registered-models/alias", params={"name": name, "alias": "champion"}
    )
    if found.status_code == 200:
        return found.json()["model_version"]
    versions = _mlflow(
        stack, "promoter", "GET", "/api/2.0/mlflow/model-versions/search", params={"filter": f"name='{name}'"}
    )
    listed = versions.json().get("model_versions", []) if versions.status_code == 200 else []
    if not listed:
        raise LookupError(f"registered model '{name}' has no version: run the pipeline once before the attacks")
    return max(listed, key=lambda v: int(v["version"]))


def _refused_statuses(name: str, expected: str, attempts: dict) -> dict:
    """Every attempt answered 403."""
    statuses = {what: send().status_code for what, send in attempts.items()}
    observed = ", ".join(f"{what}: {status}" for what, status in statuses.items())
    return _result(name, expected, observed, all(s == 403 for s in statuses.values()))


# --- the registry -----------------------------------------------------------------------------------------


def trainer_overwrites_registered_code(stack) -> dict:
    """The champion's model code file replaced through the artifacts API as the trainer (EDIT on the experiment
    allows it): the loader of promote and the gate must refuse the version before loading anything."""
    import mlflow
    import yaml

    from contextual_bert.registry import IntegrityError, verified_copy, version_files_uri

    name, expected = "trainer overwrites a registered version's code", "403, or the version refused by its digest"
    model = _get(stack, "model_name")
    client = mlflow.MlflowClient(tracking_uri=_get(stack, "mlflow_uri"), registry_uri=_get(stack, "mlflow_uri"))
    with _as(stack, "promoter"):
        version = client.get_model_version(model, _target(stack)["version"])
        location = version_files_uri(client, model, version)
    parsed = urlparse(location)
    if parsed.scheme != "mlflow-artifacts":
        return _result(name, expected, f"files at {location}: not behind the MLflow server's artifacts API", False)
    files = f"/api/2.0/mlflow-artifacts/artifacts{parsed.path}"
    mlmodel = _mlflow(stack, "promoter", "GET", f"{files}/MLmodel")
    mlmodel.raise_for_status()
    # a model logged from code: its file, stored under its own name beside MLmodel
    code = Path(yaml.safe_load(mlmodel.text)["flavors"]["python_function"]["model_code_path"]).name
    original = _mlflow(stack, "promoter", "GET", f"{files}/{code}")
    original.raise_for_status()
    put = _mlflow(
        stack, "trainer", "PUT", f"{files}/{code}", data=original.content + b"\nraise SystemExit('replaced')\n"
    )
    try:
        with tempfile.TemporaryDirectory() as tmp, _as(stack, "promoter"):
            verified_copy(client, model, version, Path(tmp))
        detected = "loaded: the change was not detected"
    except IntegrityError as exc:
        detected = f"refused: {exc}"
    finally:
        if put.status_code == 200:  # put the file back, as the promoter
            _mlflow(stack, "promoter", "PUT", f"{files}/{code}", data=original.content).raise_for_status()
    refused = put.status_code == 403 or detected.startswith("refused")
    return _result(name, expected, f"PUT of {code} as trainer: {put.status_code}; then {detected}", refused)


def trainer_forges_promotion_tags(stack) -> dict:
    model, v = _get(stack, "model_name"), _target(stack)["version"]
    base = "/api/2.0/mlflow"

    def tag(path, method="POST", **body):
        return lambda: _mlflow(stack, "trainer", method, f"{base}/{path}", json={"name": model, **body})

    return _refused_statuses(
        "trainer writes the tags promotion and rollback read",
        "403 for each",
        {
            "val metric": tag("model-versions/set-tag", version=v, key="val/recall_at_5", value="0.99"),
            "rolled_back": tag("model-versions/set-tag", version=v, key="rolled_back", value="true"),
            "digest": tag("model-versions/set-tag", version=v, key="artifacts_sha256", value="0" * 64),
            "digest deleted": tag("model-versions/delete-tag", "DELETE", version=v, key="artifacts_sha256"),
            "champion_history": tag("registered-models/set-tag", key="champion_history", value="[]"),
            "version with a forged record": tag(
                "model-versions/create", source="models:/m-0", tags=[{"key": "artifacts_sha256", "value": "0" * 64}]
            ),
        },
    )


def trainer_sets_lookalike_aliases(stack) -> dict:
    model, v = _get(stack, "model_name"), _target(stack)["version"]
    alias = "/api/2.0/mlflow/registered-models/alias"
    return _refused_statuses(
        "trainer sets 'champion' in another spelling",
        "403 for each",
        {
            repr(spelling): (
                lambda spelling=spelling: _mlflow(
                    stack, "trainer", "POST", alias, json={"name": model, "alias": spelling, "version": v}
                )
            )
            for spelling in ("champion", "Champion", "CHAMPION", "champion\n", " champion", "Previous")
        },
    )


def trainer_moves_a_version_to_a_legacy_stage(stack) -> dict:
    model, v = _get(stack, "model_name"), _target(stack)["version"]
    path = "/api/2.0/mlflow/model-versions/transition-stage"
    return _refused_statuses(
        "trainer moves a version to a legacy stage",
        "403 for each",
        {
            stage: (
                lambda stage=stage: _mlflow(
                    stack,
                    "trainer",
                    "POST",
                    path,
                    json={"name": model, "version": v, "stage": stage, "archive_existing_versions": False},
                )
            )  # fmt: skip
            for stage in ("Production", "Staging")
        },
    )


def trainer_creates_experiments_and_models(stack) -> dict:
    suffix = str(int(time.time()))
    return _refused_statuses(
        "trainer creates an experiment or a registered model",
        "403 for each (only admin creates them)",
        {
            "experiment": lambda: _mlflow(
                stack, "trainer", "POST", "/api/2.0/mlflow/experiments/create", json={"name": f"attack-{suffix}"}
            ),
            "registered model": lambda: _mlflow(
                stack, "trainer", "POST", "/api/2.0/mlflow/registered-models/create", json={"name": f"attack-{suffix}"}
            ),
        },
    )


class _as:
    """MLflow's client reads its user from the environment at each request."""

    def __init__(self, stack, user: str):
        self.values = {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": _get(stack, "passwords")[user]}

    def __enter__(self):
        import os

        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        import os

        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- the serving gate ---------------------------------------------------------------------------------------


def _score(stack, body: bytes, content_type: str = "application/json") -> requests.Response:
    headers = {"Authorization": f"Bearer {_get(stack, 'serving_token')}", "Content-Type": content_type}
    return requests.post(f"{_get(stack, 'gate_url')}/invocations", data=body, headers=headers, timeout=TIMEOUT)


def gate_csv_over_the_row_cap(stack) -> dict:
    body = ("article_ids\n" + "x\n" * 50_000).encode()
    status = _score(stack, body, "text/csv").status_code
    return _result("CSV body of 50,000 rows", "415 (JSON only) or 413", str(status), status in (413, 415))


def gate_malformed_bodies(stack) -> dict:
    bodies = {
        "nested 4,000 deep": b"[" * 4000 + b"]" * 4000,
        "5,000-digit integer": b'{"dataframe_split": {"columns": ["x"], "data": [[' + b"9" * 5000 + b"]]}}",
        "not UTF-8": b'{"dataframe_split": {"columns": ["\xff"], "data": [[1]]}}',
        "names no rows": b'{"messages": []}',
    }
    statuses = {what: _score(stack, body).status_code for what, body in bodies.items()}
    observed = ", ".join(f"{what}: {status}" for what, status in statuses.items())
    return _result("malformed bodies", "400 for each, never a 500", observed, all(s == 400 for s in statuses.values()))


def _gate_address(stack) -> tuple[str, int]:
    parsed = urlparse(_get(stack, "gate_url"))
    return parsed.hostname, parsed.port


def gate_header_dribble(stack) -> dict:
    """Twenty connections sending their headers a byte every 0.5 s: all closed within the header timeout."""
    bound = float(_get(stack, "gate_timeout_s", 30)) + 5
    socks = [socket.create_connection(_gate_address(stack), timeout=5) for _ in range(20)]
    started, open_ = time.monotonic(), set(range(len(socks)))
    for sock in socks:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\n")
    while open_ and time.monotonic() - started < bound:
        for i in list(open_):
            try:
                socks[i].sendall(b"X")
            except OSError:
                open_.discard(i)
        time.sleep(0.5)
    elapsed = time.monotonic() - started
    for sock in socks:
        sock.close()
    observed = f"{len(socks) - len(open_)} of {len(socks)} closed after {elapsed:.0f} s"
    return _result("20 clients dribbling headers", f"all closed within {bound:.0f} s", observed, not open_)


def gate_body_dribble(stack) -> dict:
    from flows.infra.attacks import dribble_body  # the repository on sys.path: stack_from_dir's

    bound = float(_get(stack, "gate_timeout_s", 30)) + 5
    status, seconds = dribble_body(_gate_address(stack), _get(stack, "serving_token"), bound)
    return _result(
        "a client dribbling its body",
        f"408 within {bound:.0f} s",
        f"{status} after {seconds:.0f} s",
        status.startswith("HTTP/1.1 408"),
    )


REGISTRY_ATTACKS = [
    trainer_overwrites_registered_code,
    trainer_forges_promotion_tags,
    trainer_sets_lookalike_aliases,
    trainer_moves_a_version_to_a_legacy_stage,
    trainer_creates_experiments_and_models,
]
GATE_ATTACKS = [gate_csv_over_the_row_cap, gate_malformed_bodies, gate_header_dribble, gate_body_dribble]
ATTACKS = REGISTRY_ATTACKS + GATE_ATTACKS


def stack_from_dir(root: Path, gate_url: str | None = None, gate_timeout_s: float = 30) -> dict:
    """The `stack` of a stack directory made by `python -m flows.infra.stack up` (stack.json, credentials.env)."""
    import sys

    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo))  # `flows` is a top-level folder of the repository
    from flows.infra import auth
    from flows.infra.stack import mlflow_names

    info = json.loads((root / "stack.json").read_text())
    creds = auth.read_env_file(root / auth.CREDENTIALS)
    return {
        "mlflow_uri": info["MLFLOW_TRACKING_URI"],
        "passwords": {u: creds[f"MLFLOW_{u.upper()}_PASSWORD"] for u in ("admin", "trainer", "promoter")},
        "model_name": mlflow_names(repo)[1],
        "gate_url": gate_url,
        "serving_token": creds.get("SERVING_TOKEN"),
        "gate_timeout_s": gate_timeout_s,
    }


if __name__ == "__main__":  # python benchmarks/security_attacks_registry.py [.stack] [http://127.0.0.1:5001]
    import sys

    args = sys.argv[1:]
    target = stack_from_dir(Path(args[0] if args else ".stack").resolve(), args[1] if len(args) > 1 else None)
    chosen = ATTACKS if target["gate_url"] else REGISTRY_ATTACKS
    print(json.dumps([attack(target) for attack in chosen], indent=2))
