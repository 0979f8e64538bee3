"""A thin front for the served model: MLflow's scoring server (`mlflow models serve`'s app, unchanged)
behind a credential check, caps on a request's size, rows and time, and a check of what it serves. MLflow
serving itself checks nothing.

    CONTEXTUAL_BERT_SERVING_TOKEN=... python -m contextual_bert.serving.gate -m models:/outfit-completion@champion \
        [--host 127.0.0.1] [--port 5001] [--max-body-bytes 1048576] [--max-rows 1000] \
        [--header-timeout 10] [--body-timeout 30]

- What it serves: a registered version (models:/<name>/<version> or models:/<name>@<alias>) only after its
  files match the digest `register` recorded (registry/integrity.py): a version changed since, or with no
  digest, is refused with one line and the gate does not start. A local directory is served as it is (the
  operator's own files); any other remote URI (runs:/, a logged model's id) is refused: nothing vouches for it.
- Credential (when asked for: CONTEXTUAL_BERT_SERVING_TOKEN set, or --require-token): every request but
  GET /ping and /health needs `Authorization: Bearer <token>`; otherwise 401. Compared in constant time.
  The token comes from the environment only: a command line shows in `ps`.
- A body over --max-body-bytes (by Content-Length, or counted as it arrives): 413, before the model sees it.
- JSON only (Content-Type application/json): 415 for any other type. MLflow's server also reads CSV and
  Parquet, where a 1 MiB body holds millions of rows; one format the gate parses is one row cap it enforces.
- The body parsed here, as MLflow will parse it: malformed (not JSON, nested deeper than MAX_DEPTH, an
  integer of more than MAX_INT_DIGITS digits) or naming no rows (dataframe_split / dataframe_records /
  instances / inputs): 400. More than --max-rows rows: 413. Never a 500 for a body.
- Slow clients: a connection whose request headers are not complete within --header-timeout seconds is
  closed; a body not complete within --body-timeout seconds of the first read gets 408.
- Logs: uvicorn's access log is off (it would show paths only, but a proxy may put secrets in query
  strings); the gate logs the status and row count of refused requests, never a header.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlparse

TOKEN_ENV = "CONTEXTUAL_BERT_SERVING_TOKEN"
UNGUARDED = ("/ping", "/health")  # load balancers' probes
JSON = "application/json"
MAX_DEPTH = 16  # a request is at most 6 deep (dataframe_split -> data -> row -> history -> outfit)
MAX_INT_DIGITS = 20  # an int64 has 19; Python refuses 4,300+ with an error MLflow turns into a 500
log = logging.getLogger("contextual_bert.serving.gate")


class BadBody(ValueError):
    """A request body the gate refuses with 400."""


def count_rows(payload) -> int | None:
    """Rows of an MLflow scoring request body (None when it names none of the known fields)."""
    if not isinstance(payload, dict):
        return None
    if isinstance(payload.get("dataframe_split"), dict):
        return len(payload["dataframe_split"].get("data") or [])
    for key in ("dataframe_records", "instances"):
        if isinstance(payload.get(key), list):
            return len(payload[key])
    inputs = payload.get("inputs")
    if isinstance(inputs, list):
        return len(inputs)
    if isinstance(inputs, dict):  # columns -> lists
        lengths = [len(v) for v in inputs.values() if isinstance(v, list)]
        return max(lengths) if lengths else 1
    return None


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise BadBody(f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _depth(value) -> int:
    """How deeply lists and objects nest in `value` (iterative: a deep value must not exhaust the stack)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                break
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_body(body: bytes) -> int:
    """The rows of a JSON scoring request, or BadBody naming what is wrong with it."""
    try:
        payload = json.loads(body, parse_int=_bounded_int)
    except BadBody:
        raise
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser's stack
        raise BadBody(f"not valid JSON ({type(exc).__name__})") from None
    if _depth(payload) > MAX_DEPTH:
        raise BadBody(f"nested deeper than {MAX_DEPTH} levels")
    rows = count_rows(payload)
    if rows is None:
        raise BadBody("names no rows: send dataframe_split, dataframe_records, instances or inputs")
    return rows


def mime_type(content_type: str | None) -> str | None:
    """The media type as MLflow's scoring server reads it (the part before ';', stripped)."""
    return None if content_type is None else content_type.split(";")[0].strip()


class Gate:
    """ASGI middleware around the scoring app."""

    def __init__(self, app, token: str | None, max_body_bytes: int, max_rows: int, body_timeout_s: float = 30.0):
        self.app, self.token = app, token
        self.max_body_bytes, self.max_rows, self.body_timeout_s = max_body_bytes, max_rows, body_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.token is not None and scope["path"] not in UNGUARDED and not self._authorized(scope, self.token):
            log.warning("refused %s %s: 401 (no valid credential)", scope["method"], scope["path"])
            return await _answer(
                send, 401, "a credential is required: Authorization: Bearer <token>", [(b"www-authenticate", b"Bearer")]
            )
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return await self._refuse(send, scope, 413, f"body of {length} bytes")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        body, more = b"", True
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return await self._refuse(send, scope, 408, f"body not complete within {self.body_timeout_s:g} s")
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body_bytes:
                return await self._refuse(send, scope, 413, f"body over {self.max_body_bytes} bytes")
        if body or scope["method"] == "POST":
            kind = mime_type(_header(scope, b"content-type"))
            if kind != JSON:
                return await self._refuse(send, scope, 415, f"content type {kind!r}: only {JSON} is accepted")
            try:
                rows = parse_body(body)
            except BadBody as exc:
                return await self._refuse(send, scope, 400, f"malformed body: {exc}")
            if rows > self.max_rows:
                return await self._refuse(send, scope, 413, f"{rows} rows")

        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)

    def _authorized(self, scope, token: str) -> bool:
        value = _header(scope, b"authorization") or ""
        scheme, _, given = value.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())

    async def _refuse(self, send, scope, status: int, what: str):
        log.warning("refused %s %s: %d (%s)", scope["method"], scope["path"], status, what)
        if status == 413:
            what = f"request too large ({what}): at most {self.max_body_bytes} bytes and {self.max_rows} rows a request"
        return await _answer(send, status, what)


def header_deadline_protocol(header_timeout_s: float):
    """uvicorn's HTTP protocol, closing a connection whose next request's headers are not complete within
    `header_timeout_s` (uvicorn bounds only the idle time between requests: a client sending a byte now and
    then would hold a connection for ever). The ASGI app never sees such a request, so this lives here."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadline(H11Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            self._expect_headers(None)

        def on_response_complete(self):
            answered = self.cycle
            super().on_response_complete()
            self._expect_headers(answered)

        def _expect_headers(self, answered):
            def expire():
                # No request has started since: its headers are late (or the connection idles).
                if self.cycle is answered and not self.transport.is_closing():
                    log.warning("closed a connection: request headers not complete within %g s", header_timeout_s)
                    self.transport.close()

            self.loop.call_later(header_timeout_s, expire)

    return HeaderDeadline


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _answer(send, status: int, message: str, headers=()):
    body = json.dumps({"error_code": status, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


def served_files(model_uri: str) -> str:
    """What the gate loads for `model_uri`: a registered version's verified local copy, or a local directory."""
    from contextual_bert.errors import ContextualBertError

    if model_uri.startswith("models:/"):
        rest = model_uri[len("models:/") :]
        name, at, alias = rest.rpartition("@")
        name, reference = (name, f"@{alias}") if at else (rest.rpartition("/")[0], rest.rpartition("/")[2])
        if name and reference:
            import mlflow

            from contextual_bert.registry.integrity import resolve_version, verified_copy

            client = mlflow.MlflowClient()
            version = resolve_version(client, name, reference)
            into = Path(tempfile.mkdtemp(prefix="gate-model-"))  # lives as long as the server
            return str(verified_copy(client, name, version, into))
    elif urlparse(model_uri).scheme in ("", "file"):
        return model_uri
    raise ContextualBertError(
        f"{model_uri}: the gate serves a registered version (models:/<name>/<version> or models:/<name>@<alias>), "
        "checked against its recorded digest, or a local directory; nothing vouches for other URIs"
    )


def build_app(model_uri: str, token: str | None, max_body_bytes: int, max_rows: int, body_timeout_s: float = 30.0):
    from mlflow.pyfunc import scoring_server

    model = scoring_server.load_model_with_mlflow_config(served_files(model_uri))
    return Gate(scoring_server.init(model), token, max_body_bytes, max_rows, body_timeout_s)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from contextual_bert.errors import ContextualBertError

    parser = argparse.ArgumentParser(prog="python -m contextual_bert.serving.gate", description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model-uri", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5001)
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--max-rows", type=int, default=1000)
    parser.add_argument("--header-timeout", type=float, default=10.0, help="seconds for a request's headers")
    parser.add_argument("--body-timeout", type=float, default=30.0, help="seconds for a request's body")
    parser.add_argument("--require-token", action="store_true", help=f"refuse to start without {TOKEN_ENV}")
    args = parser.parse_args(argv)
    token = os.environ.get(TOKEN_ENV) or None
    if args.require_token and token is None:
        parser.error(f"--require-token: {TOKEN_ENV} is not set")
    if token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "serving on %s without a credential: anyone who reaches it may score (set %s)", args.host, TOKEN_ENV
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        app = build_app(args.model_uri, token, args.max_body_bytes, args.max_rows, args.body_timeout)
    except ContextualBertError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        http=header_deadline_protocol(args.header_timeout),
        access_log=False,
        log_level="info",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
