"""Serving under load: `mlflow models serve` (the champion) soaked by concurrent clients for minutes, while
`promote` moves the champion alias.

The model is built as benchmarks/serving_latency.py builds it (synthetic data of params' generate.size ->
features -> a ContextualBert at params' sizes, untrained: a forward pass costs the same whatever the weights ->
the pyfunc logged from code into a temporary MLflow store). Two versions are registered, with other weights;
version 1 is the champion the server starts on (`models:/outfit-completion@champion`, loopback only).

--clients threads, each with its own keep-alive connection, send requests until --minutes have passed (every
loop bounded by the deadline and --max-requests): valid ones (one row, or a batch of 2-128 rows of real
validation outfits less one article) and malformed ones (a body that is not JSON, no 'article_ids' column,
junk in 'article_ids', a junk top_k, articles the model does not know). Valid requests must be answered 200,
malformed ones 200 (what the contract answers: unknown articles reported) or 400 (refused in one line); any 5xx
or broken connection is a server error. Halfway, `promotion.move_champion` (what `promote` runs when a
candidate wins) points the alias at version 2: the running server keeps answering, and keeps answering with
version 1 (a fixed probe request, before and after); a server started afterwards answers with version 2.
The server's memory (RSS of its process tree) is sampled every --sample-s seconds.

Writes reports/benchmarks/serving_soak.json. The machine's load (shared 2-core CPU) is recorded with it.

    .venv/bin/python benchmarks/serving_soak.py [--minutes 10] [--clients 8]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving_latency import (  # noqa: E402
    MODEL_NAME,
    REPO,
    build_project,
    free_port,
    percentiles,
    register_champion,
    register_version,
    request_rows,
    wait_until_up,
)

OUT = REPO / "reports" / "benchmarks" / "serving_soak.json"
MALFORMED = ("not_json", "no_article_ids", "junk_article_ids", "junk_top_k", "unknown_articles")


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and its descendants (the mlflow CLI and its uvicorn worker), MB."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return float("nan")
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def start_server(model_uri: str, log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    server = subprocess.Popen(
        [
            str(bin_dir / "mlflow"),
            "models",
            "serve",
            "-m",
            model_uri,
            "--env-manager",
            "local",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],  # fmt: skip
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_until_up(port, server, timeout=300)
    return server, port


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its uvicorn worker
        server.wait(timeout=60)


def post(connection: http.client.HTTPConnection, body: bytes) -> tuple[int, bytes]:
    connection.request("POST", "/invocations", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, response.read()


def make_request(kind: str, records: list[dict], rng: random.Random) -> bytes:
    """The body of one request of `kind`: "single", "batch" or one of MALFORMED."""
    if kind == "single":
        return json.dumps({"dataframe_records": [rng.choice(records)]}).encode()
    if kind == "batch":
        start = rng.randrange(len(records))
        rows = [records[(start + i) % len(records)] for i in range(rng.randint(2, 128))]
        return json.dumps({"dataframe_records": rows}).encode()
    row = dict(rng.choice(records))
    if kind == "not_json":
        return b'{"dataframe_records": [{"article_ids": ["A1", '
    if kind == "no_article_ids":
        row.pop("article_ids")
        return json.dumps({"dataframe_records": [row]}).encode()
    if kind == "junk_article_ids":
        row["article_ids"] = rng.choice([17, "not a list", [None], [[1, 2]], {"a": 1}])
        return json.dumps({"dataframe_records": [row]}).encode()
    if kind == "junk_top_k":
        return json.dumps({"dataframe_records": [row], "params": {"top_k": rng.choice([-1, 0, 10**6, "ten"])}}).encode()
    if kind == "unknown_articles":
        row["article_ids"] = [f"no-such-article-{rng.randrange(10**6)}" for _ in range(3)]
        return json.dumps({"dataframe_records": [row]}).encode()
    raise ValueError(kind)


def client_loop(port: int, records: list[dict], seed: int, deadline: float, max_requests: int, out: list) -> None:
    """Requests until the deadline (at most max_requests): (kind, status, seconds, rows) each; status 0 for a
    broken connection (then a new one)."""
    rng = random.Random(seed)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for _ in range(max_requests):
        if time.monotonic() >= deadline:
            break
        draw = rng.random()
        kind = "single" if draw < 0.55 else "batch" if draw < 0.85 else rng.choice(MALFORMED)
        body = make_request(kind, records, rng)
        began = time.perf_counter()
        try:
            status, _ = post(connection, body)
        except (OSError, http.client.HTTPException):
            status = 0
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        rows = body.count(b'"article_ids"') if kind == "batch" else 1
        out.append((kind, status, time.perf_counter() - began, rows))
    connection.close()


def answer(port: int, body: bytes) -> list:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    status, raw = post(connection, body)
    connection.close()
    if status != 200:
        raise SystemExit(f"the probe request failed: {status} {raw[:300]!r}")
    return [row["article_ids"] for row in json.loads(raw)["predictions"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--size", default=None, help="generate size for the built model (default: params')")
    parser.add_argument("--variant", default="global_state_update")
    parser.add_argument("--max-requests", type=int, default=200_000, help="per client: bounds every loop")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between memory samples")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    import mlflow
    import torch

    from contextual_bert.config import load_config
    from contextual_bert.model import ContextualBert, load_checkpoint, save_checkpoint
    from contextual_bert.registry import CHAMPION, move_champion

    cfg = load_config(REPO / "params.yaml")
    size = args.size or cfg.generate.size
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="serving-soak-") as tmp:
        work = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work}/mlflow.db"
        model, features_dir = build_project(work, size, args.variant)
        model_uri = register_champion(work, features_dir)  # version 1
        first, _ = load_checkpoint(work / "checkpoint.pt")
        torch.manual_seed(1)  # version 2: other weights, so the two versions answer differently
        second = ContextualBert(first.model_cfg, first.name, first.n_ids, first.spec)
        save_checkpoint(work / "checkpoint_v2.pt", second, {"untrained": True, "seed": 1})
        v2 = register_version(work, work / "checkpoint_v2.pt", features_dir)
        records = request_rows(work / "validated", features_dir, n=4096)
        probe = json.dumps({"dataframe_records": records[:16]}).encode()

        server, port = start_server(model_uri, work / "serve.log")
        try:
            before_move = answer(port, probe)
            for _ in range(20):  # warm-up before the memory baseline
                answer(port, probe)
            started = time.monotonic()
            deadline = started + args.minutes * 60
            memory = [(0.0, tree_rss_mb(server.pid))]
            results: list[list] = [[] for _ in range(args.clients)]
            threads = [threading.Thread(target=client_loop, daemon=True,
                                        args=(port, records, seed, deadline, args.max_requests, results[seed]))
                       for seed in range(args.clients)]  # fmt: skip
            for thread in threads:
                thread.start()
            moved_at = None
            mlflow_client = mlflow.MlflowClient()
            while any(t.is_alive() for t in threads) and time.monotonic() < deadline + 180:
                time.sleep(
                    min(args.sample_s, max(0.1, deadline - time.monotonic())) if time.monotonic() < deadline else 1.0
                )
                now = time.monotonic() - started
                memory.append((round(now, 1), tree_rss_mb(server.pid)))
                if moved_at is None and now >= args.minutes * 30:
                    champion = mlflow_client.get_model_version_by_alias(MODEL_NAME, CHAMPION)  # version 1
                    move_champion(mlflow_client, MODEL_NAME, v2.version, champion)
                    moved_at = round(now, 1)
            for thread in threads:
                thread.join(timeout=1)
            hung = sum(t.is_alive() for t in threads)
            seconds = time.monotonic() - started
            after_move = answer(port, probe)
            memory_end = tree_rss_mb(server.pid)
            server_alive = server.poll() is None
        finally:
            stop_server(server)
        new_server, new_port = start_server(model_uri, work / "serve_new.log")
        try:
            new_answer = answer(new_port, probe)
        finally:
            stop_server(new_server)
        champion_now = mlflow.MlflowClient().get_model_version_by_alias(MODEL_NAME, CHAMPION).version

    done = [r for per_client in results for r in per_client]
    by_kind = {}
    for kind in ("single", "batch", *MALFORMED):
        mine = [r for r in done if r[0] == kind]
        statuses = {}
        for r in mine:
            statuses[str(r[1])] = statuses.get(str(r[1]), 0) + 1
        by_kind[kind] = {
            "requests": len(mine),
            "statuses": statuses,
            **({k: v for k, v in percentiles([r[2] for r in mine]).items() if k != "n"} if mine else {}),
        }
    valid = [r for r in done if r[0] in ("single", "batch")]
    server_errors = sum(1 for r in done if r[1] >= 500 or r[1] == 0)
    unexpected = [
        r
        for r in done
        if (r[0] in ("single", "batch") and r[1] != 200) or (r[0] in MALFORMED and r[1] not in (200, 400))
    ]
    rss = [m for _, m in memory]

    def trend(samples):  # MB per minute, least squares
        return (
            round(float(np.polyfit([t for t, _ in samples], [m for _, m in samples], 1)[0]) * 60, 3)
            if len(samples) > 2
            else None
        )

    half = [(t, m) for t, m in memory if t >= seconds / 2]
    result = {
        "what": "mlflow models serve --env-manager local (one uvicorn worker), loopback; concurrent keep-alive "
        "clients, POST /invocations, dataframe_records",
        "model": model,
        "minutes": round(seconds / 60, 2),
        "clients": args.clients,
        "requests": len(done),
        "throughput": {
            "requests_per_s": round(len(done) / seconds, 1),
            "valid_rows_per_s": round(sum(r[3] for r in valid) / seconds, 1),
        },
        "latency_all": {k: v for k, v in percentiles([r[2] for r in done]).items()},
        "by_kind": by_kind,
        "server_errors": server_errors,
        "unexpected_statuses": len(unexpected),
        "clients_still_running_at_the_end": hung,
        "memory_mb": {
            "start": round(rss[0], 1),
            "end": round(memory_end, 1),
            "min": round(min(rss), 1),
            "max": round(max(rss), 1),
            "trend_mb_per_min": trend(memory),
            "second_half": {
                "from": round(half[0][1], 1) if half else None,
                "to": round(memory_end, 1),
                "trend_mb_per_min": trend(half),
            },
            "samples": [[t, round(m, 1)] for t, m in memory],
        },
        "promotion": {
            "champion_moved_at_s": moved_at,
            "champion_after": int(champion_now),
            "running_server_alive_after": server_alive,
            "running_server_answers_as_before_the_move": after_move == before_move,
            "a_server_started_after_answers_with_the_new_champion": new_answer != before_move,
            "how_a_served_model_picks_up_a_new_champion": "it does not while it runs: `mlflow models serve -m "
            "models:/<name>@champion` resolves the alias once, at start; restart it (or start a new server "
            "and move the traffic) after `promote`",
        },
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "memory_mb"}, indent=2))
    print("memory:", {k: v for k, v in result["memory_mb"].items() if k != "samples"})


if __name__ == "__main__":
    main()
