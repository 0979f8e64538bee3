"""The serving gate (contextual_bert.serving.gate), a real server on loopback in front of MLflow's scoring
app: no credential 401, the right one 200, over the body or row cap 413 (and the server still answers),
any content type but JSON 415, every malformed body 400 (never a 500), a client dribbling its headers
dropped and one dribbling its body answered 408 within the timeouts, and the token in no line of its log.
A toy pyfunc stands in for the model: the gate never looks inside. (That the gate serves a registered
version only when its files match their digest: tests/registry/test_registry_security.py.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow.pyfunc
import pytest
from helpers import free_port, stop_process_group, wait_for_http

TOKEN = "gate-test-token-7f3a9c"
TIMEOUT_S = 2  # the gate's header and body timeouts here


ECHO = """import mlflow.models, mlflow.pyfunc


class Echo(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return [len(model_input)] * len(model_input)


mlflow.models.set_model(Echo())
"""


def _post(url: str, body: bytes, headers: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **headers})
    if "Content-Type" in headers and headers["Content-Type"] is None:
        request.remove_header("Content-type")  # urllib's spelling of the header it stores
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
                "8192",
                "--max-rows",
                "10",
                "--header-timeout",
                str(TIMEOUT_S),
                "--body-timeout",
                str(TIMEOUT_S),
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
    big = json.dumps({"dataframe_split": {"columns": ["x"], "data": [["y" * 9000]]}}).encode()
    status, body = _post(url, big, ok)
    assert status == 413 and "bytes" in body["message"], body
    assert _post(url, rows(10), ok)[0] == 200  # at the cap, and still up
    assert _post(url, b"not json", ok)[0] == 400  # the scoring server's own answer
    text = Path(log).read_text()
    assert "413" in text and TOKEN not in text


def test_the_gate_accepts_json_only(gate):
    """MLflow's server also reads CSV and Parquet, where a small body holds many rows the gate cannot count."""
    url, _ = gate
    ok = {"Authorization": f"Bearer {TOKEN}"}
    csv = ("x\n" + "".join(f"{i}\n" for i in range(50))).encode()  # 50 rows under --max-rows 10
    for content_type in ("text/csv", "application/vnd.apache.parquet", "text/plain", " text/csv; charset=utf-8"):
        status, body = _post(url, csv, {**ok, "Content-Type": content_type})
        assert status == 415 and "only application/json" in body["message"], (content_type, body)
    assert _post(url, rows(2), {**ok, "Content-Type": None})[0] == 415
    assert _post(url, rows(2), {**ok, "Content-Type": "application/json; charset=utf-8"})[0] == 200


MALFORMED = {
    "deeply nested": b"[" * 4000 + b"]" * 4000,  # under the body cap: the parser's own depth limit
    "nested in a row": json.dumps(
        {"dataframe_split": {"columns": ["x"], "data": [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]}}
    ).encode(),
    "5,000-digit integer": b'{"dataframe_split": {"columns": ["x"], "data": [[' + b"9" * 5000 + b"]]}}",
    "4,000-digit integer": b'{"dataframe_split": {"columns": ["x"], "data": [[' + b"9" * 4000 + b"]]}}",
    "not UTF-8": b'{"dataframe_split": {"columns": ["\xff\xfe"], "data": [[1]]}}',
    "a list": b"[1, 2, 3]",
    "no rows named": b'{"messages": [{"role": "user"}]}',
    "empty": b"",
    "truncated": rows(3)[:-5],
}
# JSON the gate passes on: MLflow refuses some (400), the toy model takes others (200); none may be a 5xx.
ODD_SHAPES = {
    "columns not a list": b'{"dataframe_split": {"columns": 5, "data": [[1]]}}',
    "ragged rows": b'{"dataframe_split": {"columns": ["x"], "data": [[1, 2], [3]]}}',
    "records not objects": b'{"dataframe_records": [1, [2]]}',
    "instances mixed": b'{"instances": [[1], {"a": 2}]}',
    "inputs of objects": b'{"inputs": {"x": {"a": 1}}}',
    "params not an object": b'{"dataframe_split": {"columns": ["x"], "data": [[1]]}, "params": [1]}',
}  # fmt: skip


def test_every_malformed_body_is_a_400_never_a_500(gate):
    url, _ = gate
    ok = {"Authorization": f"Bearer {TOKEN}"}
    statuses = {what: _post(url, body, ok)[0] for what, body in MALFORMED.items()}
    assert statuses == dict.fromkeys(MALFORMED, 400)
    odd = {what: _post(url, body, ok)[0] for what, body in ODD_SHAPES.items()}
    assert all(status < 500 for status in odd.values()), odd
    assert _post(url, rows(2), ok)[0] == 200  # and still up


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closes `sock` (None if it has not within `seconds`), reading what it sends."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < seconds:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except OSError:  # reset
            return time.monotonic() - started
    return None


def test_a_client_dribbling_its_headers_is_dropped(gate):
    """Twenty connections sending their request headers a byte at a time: each closed by the gate soon after
    --header-timeout, not held for as long as the client keeps sending."""
    url, _ = gate
    port = int(url.split(":")[2].split("/")[0])
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
    started = time.monotonic()
    for sock in socks:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\n")
    closed = set()
    while time.monotonic() - started < TIMEOUT_S + 8 and len(closed) < len(socks):
        for i, sock in enumerate(socks):
            if i in closed:
                continue
            try:
                sock.sendall(b"X")  # one more byte of a header that never ends
            except OSError:
                closed.add(i)
        time.sleep(0.3)
    elapsed = time.monotonic() - started
    for sock in socks:
        sock.close()
    assert len(closed) == len(socks), (
        f"{len(socks) - len(closed)} dribbling connections still open after {elapsed:.0f} s"
    )
    assert elapsed < TIMEOUT_S + 8


def test_a_client_dribbling_its_body_gets_408(gate):
    from flows.infra.attacks import dribble_body

    url, _ = gate
    port = int(url.split(":")[2].split("/")[0])
    status, seconds = dribble_body(("127.0.0.1", port), TOKEN, TIMEOUT_S + 8)
    assert status.startswith("HTTP/1.1 408"), status
    assert seconds < TIMEOUT_S + 8


def test_the_gate_serves_registered_versions_or_local_files_only():
    from contextual_bert.errors import ContextualBertError
    from contextual_bert.serving.gate import served_files

    for uri in ("runs:/0123456789abcdef/model", "models:/m-0123456789abcdef", "mlflow-artifacts:/1/models/m-1"):
        with pytest.raises(ContextualBertError, match="nothing vouches for other URIs"):
            served_files(uri)
    assert served_files("/srv/model") == "/srv/model"


def test_the_benchmarks_gate_attacks_are_all_refused_here(gate):
    from test_registry_security import attacks_module

    url, _ = gate
    stack = {"gate_url": url.removesuffix("/invocations"), "serving_token": TOKEN, "gate_timeout_s": TIMEOUT_S}
    results = [attack(stack) for attack in attacks_module().GATE_ATTACKS]
    assert all(r["refused"] for r in results), [r for r in results if not r["refused"]]
