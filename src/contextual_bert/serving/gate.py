"""A thin front for the served model: MLflow's scoring server (`mlflow models serve`'s app, unchanged)
behind a credential check and caps on a request's size and rows. MLflow serving itself checks nothing.

    CONTEXTUAL_BERT_SERVING_TOKEN=... python -m contextual_bert.serving.gate -m models:/outfit-completion@champion \
        [--host 127.0.0.1] [--port 5001] [--max-body-bytes 1048576] [--max-rows 1000]

- Credential (when asked for: CONTEXTUAL_BERT_SERVING_TOKEN set, or --require-token): every request but
  GET /ping and /health needs `Authorization: Bearer <token>`; otherwise 401. Compared in constant time.
  The token comes from the environment only: a command line shows in `ps`.
- A body over --max-body-bytes (by Content-Length, or counted as it arrives): 413, before the model sees it.
- A JSON body with more than --max-rows rows (dataframe_split / dataframe_records / instances / inputs): 413.
- Logs: uvicorn's access log is off (it would show paths only, but a proxy may put secrets in query
  strings); the gate logs the status and row count of refused requests, never a header.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os

TOKEN_ENV = "CONTEXTUAL_BERT_SERVING_TOKEN"
UNGUARDED = ("/ping", "/health")  # load balancers' probes
log = logging.getLogger("contextual_bert.serving.gate")


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


class Gate:
    """ASGI middleware around the scoring app."""

    def __init__(self, app, token: str | None, max_body_bytes: int, max_rows: int):
        self.app, self.token = app, token
        self.max_body_bytes, self.max_rows = max_body_bytes, max_rows

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
            return await self._too_large(send, scope, f"body of {length} bytes")
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body_bytes:
                return await self._too_large(send, scope, f"body over {self.max_body_bytes} bytes")
        if body and "json" in (_header(scope, b"content-type") or ""):
            try:
                rows = count_rows(json.loads(body))
            except ValueError:
                rows = None  # the scoring server answers malformed JSON itself (400)
            if rows is not None and rows > self.max_rows:
                return await self._too_large(send, scope, f"{rows} rows")

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

    async def _too_large(self, send, scope, what: str):
        log.warning("refused %s %s: 413 (%s)", scope["method"], scope["path"], what)
        limits = f"at most {self.max_body_bytes} bytes and {self.max_rows} rows a request"
        return await _answer(send, 413, f"request too large ({what}): {limits}")


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


def build_app(model_uri: str, token: str | None, max_body_bytes: int, max_rows: int):
    from mlflow.pyfunc import scoring_server

    model = scoring_server.load_model_with_mlflow_config(model_uri)
    return Gate(scoring_server.init(model), token, max_body_bytes, max_rows)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m contextual_bert.serving.gate", description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model-uri", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5001)
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--max-rows", type=int, default=1000)
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
    app = build_app(args.model_uri, token, args.max_body_bytes, args.max_rows)
    uvicorn.run(app, host=args.host, port=args.port, access_log=False, log_level="info")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
