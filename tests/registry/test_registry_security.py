"""A trainer cannot become the promoter through the registry (issue 90, findings 2 and 3, items of 6).

A real MLflow server behind the `contextual-bert-auth` app (SQLite store, artifacts proxied under a
directory, users and grants made by the stack's own `setup_mlflow`), and as each user what an attacker
would try: the trainer rewriting a registered model's files through the artifacts API (detected before
anything is loaded: by promote's loader and the serving gate), writing the tags that steer promotion and
rollback, lookalike aliases, the legacy stages; a user without grants creating experiments and models.
A toy pyfunc stands in for the model: the checks never look inside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import mlflow
import pytest
import requests
from helpers import free_port, stop_process_group, wait_for_http

from contextual_bert.registry import integrity
from flows.infra import auth

pytestmark = pytest.mark.slow  # an MLflow server migrating its store: minutes on a loaded machine

EXPERIMENT, MODEL = "security", "guarded-model"
ECHO = """import mlflow.models, mlflow.pyfunc


class Echo(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return [len(model_input)] * len(model_input)


mlflow.models.set_model(Echo())
"""


@contextmanager
def as_user(server, user: str):
    """MLflow's client reads the user from the environment at each request."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    os.environ.update({"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": server["passwords"][user]})
    try:
        yield mlflow.MlflowClient(tracking_uri=server["uri"], registry_uri=server["uri"])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow-auth")
    creds = auth.credentials(root / "secrets")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    cmd = [str(Path(sys.executable).parent / "mlflow"), "server", "--app-name", auth.MLFLOW_APP]
    cmd += ["--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "art")]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING")}
    auth.set_mlflow_admin(root, creds)  # the admin user before the server starts: no password in its environment
    with open(root / "server.log", "w") as log:
        proc = subprocess.Popen(
            cmd, env={**env, **auth.mlflow_server_env(root, creds)}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=root,
        )  # fmt: skip
    saved_uri = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        wait_for_http(f"{uri}/health", proc, timeout=240)
        auth.setup_mlflow(uri, creds, EXPERIMENT, MODEL)
        passwords = {u: creds[f"MLFLOW_{u.upper()}_PASSWORD"] for u in ("admin", "trainer", "promoter")}
        passwords["reader"] = "reader-password-1234"  # a user with no grant: default_permission READ
        requests.post(
            f"{uri}/api/2.0/mlflow/users/create",
            json={"username": "reader", "password": passwords["reader"]},
            auth=("admin", passwords["admin"]),
            timeout=30,
        ).raise_for_status()
        os.environ["MLFLOW_TRACKING_URI"] = uri
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        yield {"uri": uri, "passwords": passwords, "root": root}
    finally:
        stop_process_group(proc)
        if saved_uri is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved_uri
            mlflow.set_tracking_uri(saved_uri)
            mlflow.set_registry_uri(saved_uri)


@pytest.fixture(scope="module")
def champion(server, tmp_path_factory):
    """A toy model registered as `register` does it (as the promoter, its digest recorded), made champion."""
    code = tmp_path_factory.mktemp("echo") / "echo.py"
    code.write_text(ECHO)
    with as_user(server, "promoter") as client:
        experiment = client.get_experiment_by_name(EXPERIMENT)
        logged = client.create_logged_model(experiment.experiment_id, name="echo")
        mlflow.pyfunc.log_model(name="echo", python_model=str(code), model_id=logged.model_id)
        digest = integrity.stored_digest(integrity.files_uri(client, logged.model_id), {})
        version = client.create_model_version(
            MODEL,
            source=f"models:/{logged.model_id}",
            model_id=logged.model_id,
            tags={integrity.DIGEST_TAG: digest, "val/recall_at_5": "0.25"},
        )
        client.set_registered_model_alias(MODEL, "champion", version.version)
        client.set_registered_model_tag(MODEL, "champion_history", f'["{version.version}"]')
    return {"version": version.version, "model_id": logged.model_id, "experiment_id": experiment.experiment_id}


def _status(server, user: str, method: str, path: str, **kwargs) -> int:
    return requests.request(
        method, f"{server['uri']}{path}", auth=(user, server["passwords"][user]), timeout=30, **kwargs
    ).status_code


# --- finding 2: a registered model is immutable to trainers ---------------------------------------------


def test_the_trainers_overwrite_of_a_registered_models_code_is_refused_before_anything_loads(server, champion):
    from contextual_bert.serving import gate

    path = f"{champion['experiment_id']}/models/{champion['model_id']}/artifacts/echo.py"
    files = f"/api/2.0/mlflow-artifacts/artifacts/{path}"
    with as_user(server, "promoter") as client:
        version = client.get_model_version(MODEL, champion["version"])
        stored = integrity.download(integrity.files_uri(client, champion["model_id"]), server["root"] / "before")
    assert (stored / "echo.py").exists(), sorted(p.name for p in stored.iterdir())
    evil = ECHO.replace("[len(model_input)]", "['replaced']")
    # MLflow lets EDIT on the experiment write the logged model's files; the auth app refuses it for a
    # registered version's files
    assert _status(server, "trainer", "PUT", files, data=evil.encode()) == 403
    assert _status(server, "trainer", "PUT", f"{files.rsplit('/', 1)[0]}/other.py", data=b"x") == 403
    # and had they changed (by a MANAGE holder: the promoter), nothing of the version loads
    assert _status(server, "promoter", "PUT", files, data=evil.encode()) == 200
    with as_user(server, "promoter") as client:
        with pytest.raises(integrity.IntegrityError, match="changed after registration"):
            integrity.verified_copy(client, MODEL, version, server["root"] / "check")
        with pytest.raises(integrity.IntegrityError, match="changed after registration"):
            gate.build_app(f"models:/{MODEL}@champion", None, 1 << 20, 10)
    # put back: the version loads again
    assert _status(server, "promoter", "PUT", files, data=(stored / "echo.py").read_bytes()) == 200
    with as_user(server, "promoter") as client:
        model = integrity.load_verified_pyfunc(client, MODEL, version, server["root"] / "again")
    assert list(model.predict([[1], [2]])) == [2, 2]


# --- finding 3 and item 6: what steers promotion is the promoter's ---------------------------------------


def test_the_trainer_writes_no_tag_that_steers_promotion_or_rollback(server, champion):
    v = champion["version"]
    base = "/api/2.0/mlflow"
    attempts = {
        "forged metric": ("POST", "model-versions/set-tag", {"name": MODEL, "version": v, "key": "val/recall_at_5", "value": "0.99"}),
        "rolled_back": ("POST", "model-versions/set-tag", {"name": MODEL, "version": v, "key": "rolled_back", "value": "true"}),
        "digest": ("POST", "model-versions/set-tag", {"name": MODEL, "version": v, "key": integrity.DIGEST_TAG, "value": "0" * 64}),
        "digest deleted": ("DELETE", "model-versions/delete-tag", {"name": MODEL, "version": v, "key": integrity.DIGEST_TAG}),
        "champion_history": ("POST", "registered-models/set-tag", {"name": MODEL, "key": "champion_history", "value": "[]"}),
        "history deleted": ("DELETE", "registered-models/delete-tag", {"name": MODEL, "key": "champion_history"}),
        "version with forged tags": ("POST", "model-versions/create", {"name": MODEL, "source": f"models:/{champion['model_id']}", "tags": [{"key": integrity.DIGEST_TAG, "value": "0" * 64}]}),
    }  # fmt: skip
    statuses = {
        what: _status(server, "trainer", method, f"{base}/{path}", json=body)
        for what, (method, path, body) in attempts.items()
    }
    assert statuses == dict.fromkeys(attempts, 403)
    with as_user(server, "promoter") as client:
        version = client.get_model_version(MODEL, v)
        assert version.tags["val/recall_at_5"] == "0.25" and "rolled_back" not in version.tags
        assert client.get_registered_model(MODEL).tags["champion_history"] == f'["{v}"]'
        # the promoter may (register and promote write them)
        client.set_model_version_tag(MODEL, v, "promotion_decision", "kept")


def test_lookalike_aliases_and_legacy_stages_are_refused_for_the_trainer(server, champion):
    v = champion["version"]
    alias = "/api/2.0/mlflow/registered-models/alias"
    for name in ("champion", "Champion", "CHAMPION", "champion\n", " champion", "previous", "Previous"):
        assert _status(server, "trainer", "POST", alias, json={"name": MODEL, "alias": name, "version": v}) == 403, name
    for stage in ("Production", "Staging", "production", "Archived"):
        body = {"name": MODEL, "version": v, "stage": stage, "archive_existing_versions": False}
        assert _status(server, "trainer", "POST", "/api/2.0/mlflow/model-versions/transition-stage", json=body) == 403
    assert _status(server, "trainer", "POST", alias, json={"name": MODEL, "alias": "candidate", "version": v}) == 200
    with as_user(server, "promoter") as client:
        assert client.get_model_version_by_alias(MODEL, "champion").version == v
        assert client.get_model_version(MODEL, v).current_stage == "None"


def test_a_user_without_grants_creates_no_experiment_or_registered_model(server):
    for user in ("reader", "trainer"):
        experiment = _status(server, user, "POST", "/api/2.0/mlflow/experiments/create", json={"name": f"mine-{user}"})
        model = _status(server, user, "POST", "/api/2.0/mlflow/registered-models/create", json={"name": f"m-{user}"})
        assert (experiment, model) == (403, 403), user
    assert _status(server, "reader", "GET", "/api/2.0/mlflow/experiments/search", params={"max_results": 1}) == 200


def attacks_module():
    """benchmarks/security_attacks_registry.py, the attack set the stack's security benchmark runs."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "security_attacks_registry.py"
    spec = importlib.util.spec_from_file_location("security_attacks_registry", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmarks_registry_attacks_are_all_refused_here(server, champion):
    stack = {"mlflow_uri": server["uri"], "passwords": server["passwords"], "model_name": MODEL}
    results = [attack(stack) for attack in attacks_module().REGISTRY_ATTACKS]
    assert all(r["refused"] for r in results), [r for r in results if not r["refused"]]
    overwrite = results[0]
    assert "as trainer: 403" in overwrite["observed"], overwrite
    with as_user(server, "promoter") as client:  # and put back: the version loads
        integrity.verified_copy(
            client, MODEL, client.get_model_version(MODEL, champion["version"]), server["root"] / "ok"
        )
