"""The serving gate (contextual_bert.serving.gate), a real server on loopback in front of MLflow's scoring
app: no credential 401, the right one 200, over the body or row cap 413 (and the server still answers),
and the token in no line of its log. A toy pyfunc stands in for the model: the gate never looks inside."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import mlflow.pyfunc
import pytest
from helpers import free_port, stop_process_group, wait_for_http

TOKEN = "gate-test-token-7f3a9c"


ECHO = """import mlflow.models, mlflow.pyfunc


class Echo(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return [len(model_input)] * len(model_input)


mlflow.models.set_model(Echo())
"""


def _post(url: str, body: bytes, headers: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    (root / "echo.py").write_text(ECHO)  # logged from code, as the project's pyfunc is
    mlflow.pyfunc.save_model(str(root / "model"), python_model=str(root / "echo.py"))
    port = free_port()
    env = {**os.environ, "CONTEXTUAL_BERT_SERVING_TOKEN": TOKEN}
    log_path = root / "gate.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "contextual_bert.serving.gate",
                "-m",
                str(root / "model"),
                "--port",
                str(port),
                "--max-body-bytes",
                "4096",
                "--max-rows",
                "10",
                "--require-token",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/ping", server, timeout=120)  # probes need no credential
        yield f"http://127.0.0.1:{port}/invocations", log_path
    finally:
        stop_process_group(server)


def rows(n: int) -> bytes:
    return json.dumps({"dataframe_split": {"columns": ["x"], "data": [[i] for i in range(n)]}}).encode()


def test_the_gate_refuses_a_request_without_the_token(gate):
    url, log = gate
    assert _post(url, rows(2), {})[0] == 401
    assert _post(url, rows(2), {"Authorization": "Bearer wrong"})[0] == 401
    assert _post(url, rows(2), {"Authorization": f"Basic {TOKEN}"})[0] == 401
    status, body = _post(url, rows(2), {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and body["predictions"] == [2, 2], body


def test_the_gate_caps_body_and_rows_with_413(gate):
    url, log = gate
    ok = {"Authorization": f"Bearer {TOKEN}"}
    status, body = _post(url, rows(11), ok)
    assert status == 413 and "11 rows" in body["message"], body
    big = json.dumps({"dataframe_split": {"columns": ["x"], "data": [["y" * 5000]]}}).encode()
    status, body = _post(url, big, ok)
    assert status == 413 and "bytes" in body["message"], body
    assert _post(url, rows(10), ok)[0] == 200  # at the cap, and still up
    assert _post(url, b"not json", ok)[0] == 400  # the scoring server's own answer
    text = Path(log).read_text()
    assert "413" in text and TOKEN not in text
