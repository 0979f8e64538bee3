"""Latency and throughput of the served model: `mlflow models serve` answering /invocations over HTTP.

By default the model is built here, through the real path: synthetic data of params' generate.size ->
validate -> features -> a ContextualBert at params' model sizes (weights untrained: a forward pass costs the
same whatever the weights) -> the pyfunc logged from code, registered and aliased 'champion' in a temporary
MLflow store -> `mlflow models serve -m models:/outfit-completion@champion --env-manager local`. With
--model-uri (and MLFLOW_TRACKING_URI) it serves an existing model instead, e.g. the repository's champion.

Requests are real validation outfits with one article removed, with their customer's raw context. Measured:
single-row request latency (p50/p99 over --requests sequential requests on one keep-alive connection, after
a warm-up) and batch throughput (rows/s) for several batch sizes; the same batches through the same pyfunc
in-process (no HTTP, no JSON) show what the server adds, with this process's CPU time per request beside
the wall time (`cpu`: the work, without the wait for a shared core). Torch threads per request: serving.serving_threads
(one below serving.PARALLEL_ROWS rows; from there on CONTEXTUAL_BERT_SERVING_THREADS, default 1). Writes
reports/benchmarks/serving.json, with the load average before, between and after the phases: other work on
this 2-core machine slows every number.

    .venv/bin/python benchmarks/serving_latency.py [--size default] [--variant global_state_update]
        [--model-uri models:/outfit-completion@champion] [--requests 300]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `import flows` (a top-level folder, not an installed package)
from flows.infra.net import free_port  # noqa: E402

OUT = REPO / "reports" / "benchmarks" / "serving.json"
MODEL_NAME = "outfit-completion"


def build_project(work: Path, size: str, variant: str, history: int = 0) -> tuple[dict, Path]:
    """Data, features and an untrained model at params.yaml's sizes (with `history`, features.history on and
    that many history articles); (description, features_dir)."""
    from contextual_bert.config import load_config
    from contextual_bert.data import build_features, generate, load_article_vocab, load_spec, validate
    from contextual_bert.model import ContextualBert, count_paper_parameters, save_checkpoint

    cfg = load_config(REPO / "params.yaml")
    generate(cfg.generate.sizes[size], seed=0, out_dir=work / "raw")
    validate(work / "raw", work / "validated", work / "quarantine", work / "reports", cfg.validate_)
    features_cfg = cfg.features
    if history:
        features_cfg = features_cfg.model_copy(
            update={"history": features_cfg.history.model_copy(update={"enabled": True, "max_items": history})}
        )
    build_features(work / "validated", work / "features", features_cfg, max_set_size=cfg.model.max_set_size)
    spec = load_spec(work / "features")
    n_items = len(load_article_vocab(work / "features"))
    model = ContextualBert(cfg.model_for(variant), variant, n_items, spec)
    save_checkpoint(work / "checkpoint.pt", model, {"untrained": True})
    description = {
        "source": "built by this benchmark (untrained weights)",
        "data_size": size,
        "variant": variant,
        "n_items": n_items,
        "d_context": spec.d_context,
        "model": cfg.model_for(variant).model_dump(),
        "parameters_paper_count": count_paper_parameters(model),
    }
    return description, work / "features"


def register_version(work: Path, checkpoint: Path, features_dir: Path):
    """Log the pyfunc of `checkpoint` from code into the temporary store and register it as a new version."""
    import mlflow

    from contextual_bert.config import load_config
    from contextual_bert.serving import example_request, log_pyfunc_model

    cfg = load_config(REPO / "params.yaml")
    mlflow_client = mlflow.MlflowClient()
    experiment = mlflow_client.get_experiment_by_name("benchmark")
    exp_id = (
        experiment.experiment_id
        if experiment
        else mlflow_client.create_experiment("benchmark", artifact_location=(work / "mlruns").as_uri())
    )
    logged = mlflow_client.create_logged_model(exp_id, name=MODEL_NAME)
    log_pyfunc_model(checkpoint, features_dir, model_name=MODEL_NAME, top_k=cfg.mlflow.top_k,
                     model_id=logged.model_id, input_example=example_request(features_dir))  # fmt: skip
    if not mlflow_client.search_registered_models(f"name = '{MODEL_NAME}'"):
        mlflow_client.create_registered_model(MODEL_NAME)
    return mlflow_client.create_model_version(MODEL_NAME, f"models:/{logged.model_id}", model_id=logged.model_id)


def register_champion(work: Path, features_dir: Path) -> str:
    """Log the pyfunc from code into a temporary store, register it and alias it champion."""
    import mlflow

    version = register_version(work, work / "checkpoint.pt", features_dir)
    mlflow.MlflowClient().set_registered_model_alias(MODEL_NAME, "champion", version.version)
    return f"models:/{MODEL_NAME}@champion"


def request_rows(validated_dir: Path, features_dir: Path, n: int, seed: int = 0, history: int = 0) -> list[dict]:
    """Validation outfits minus one random article, with their customer's raw context, as JSON records; with
    `history`, each with that many article ids of the vocabulary as the customer's history."""
    rng = np.random.default_rng(seed)
    split = pd.read_parquet(features_dir / "outfits.parquet", columns=["outfit_id", "split"])
    val_ids = set(split.loc[split["split"] == "val", "outfit_id"].astype(str))
    outfits = pd.read_parquet(validated_dir / "outfits.parquet")
    outfits = outfits[outfits["outfit_id"].astype(str).isin(val_ids)]
    rows = outfits.merge(pd.read_parquet(validated_dir / "customers.parquet"), on="customer_id")
    rows = rows.sample(n=n, replace=len(rows) < n, random_state=seed).reset_index(drop=True)
    partial = []
    for ids in rows["article_ids"]:
        ids = list(ids)
        ids.pop(int(rng.integers(len(ids))))
        partial.append(ids)
    rows["article_ids"] = partial
    if history:
        from contextual_bert.data import HISTORY_COLUMN, N_SPECIAL, load_article_vocab

        ids = np.asarray(load_article_vocab(features_dir).ids[N_SPECIAL:], dtype=object)
        rows[HISTORY_COLUMN] = [list(rng.choice(ids, min(history, len(ids)), replace=False)) for _ in range(len(rows))]
    from contextual_bert.data import DATE_COLUMN

    return json.loads(
        rows.drop(columns=["outfit_id", "customer_id", DATE_COLUMN], errors="ignore").to_json(orient="records")
    )


class Client:
    """One keep-alive HTTP connection to the scoring server."""

    def __init__(self, port: int):
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def invoke(self, records: list[dict]) -> tuple[int, dict]:
        body = json.dumps({"dataframe_records": records})
        self.connection.request("POST", "/invocations", body, {"Content-Type": "application/json"})
        response = self.connection.getresponse()
        return response.status, json.loads(response.read())


def wait_until_up(port: int, process: subprocess.Popen, timeout: float) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/ping")
            if connection.getresponse().status == 200:
                return time.perf_counter() - started
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the server did not answer /ping within {timeout} s")


def percentiles(seconds: list[float]) -> dict:
    ms = np.asarray(seconds) * 1000
    return {"n": len(ms), "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2), "mean_ms": round(float(ms.mean()), 2),
            "max_ms": round(float(ms.max()), 2)}  # fmt: skip


def timed(call, n: int, warmup: int = 20) -> dict:
    """percentiles() of n timed calls of call(i), i = 0..n-1, after `warmup` untimed ones (i = -warmup..-1)."""
    for i in range(-warmup, 0):
        call(i)
    seconds = []
    for i in range(n):
        started = time.perf_counter()
        call(i)
        seconds.append(time.perf_counter() - started)
    return percentiles(seconds)


def single_request_latency(client: Client, records: list[dict], n: int, warmup: int = 20) -> dict:
    def one(i: int) -> None:
        status, body = client.invoke([records[(warmup + i) % len(records)]])
        if status != 200:
            raise SystemExit(f"request {i} failed: {status} {body}")

    return timed(one, n, warmup)


def batch_throughput(score, records: list[dict], batch_size: int, min_seconds: float = 4.0, cpu: bool = False) -> dict:
    """Rows per second scoring batches of `batch_size` rows, repeated for at least min_seconds (and 3 times).

    `cpu` (in-process scoring only): also this process's CPU time per request. On a shared machine the
    wall time is the work plus the wait for a core; the CPU time is the work alone."""
    seconds, cpu_seconds, rows = [], [], 0
    score(records[:batch_size])  # warm-up
    start = 0
    while sum(seconds) < min_seconds or len(seconds) < 3:
        batch = [records[(start + i) % len(records)] for i in range(batch_size)]
        start += batch_size
        began, began_cpu = time.perf_counter(), time.process_time()
        score(batch)
        seconds.append(time.perf_counter() - began)
        cpu_seconds.append(time.process_time() - began_cpu)
        rows += batch_size
    result = {"batch_size": batch_size, "requests": len(seconds), "rows_per_s": round(rows / sum(seconds), 1),
              **{k: v for k, v in percentiles(seconds).items() if k != "n"}}  # fmt: skip
    if cpu:
        result["cpu"] = {"rows_per_cpu_s": round(rows / sum(cpu_seconds), 1),
                         **{k: v for k, v in percentiles(cpu_seconds).items() if k != "n"}}  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default=None, help="generate size for the built model (default: params')")
    parser.add_argument("--variant", default="global_state_update", help="variant of the built model")
    parser.add_argument("--model-uri", help="serve this model instead of building one (MLFLOW_TRACKING_URI)")
    parser.add_argument("--requests", type=int, default=300, help="single-row requests timed")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 128, 1024])
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="a model with features.history, each request with this many history ids (writes serving_history.json)",
    )
    args = parser.parse_args()

    from contextual_bert.config import load_config
    from contextual_bert.serving import PARALLEL_ROWS, serving_threads

    cfg = load_config(REPO / "params.yaml")
    size = args.size or cfg.generate.size
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as tmp:
        work = Path(tmp)
        if args.model_uri:  # requests from the repository's data, which that model was trained on
            model_uri, model = args.model_uri, {"source": args.model_uri}
            validated_dir, features_dir = REPO / cfg.paths.validated_dir, REPO / cfg.paths.features_dir
        else:
            os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work}/mlflow.db"
            built = time.perf_counter()
            model, features_dir = build_project(work, size, args.variant, args.history)
            model_uri = register_champion(work, features_dir)
            model["build_and_register_s"] = round(time.perf_counter() - built, 1)
            validated_dir = work / "validated"
        records = request_rows(validated_dir, features_dir, n=max(2048, max(args.batch_sizes)), history=args.history)

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
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            startup_s = wait_until_up(port, server, timeout=300)
            client = Client(port)
            single = single_request_latency(client, records, args.requests)

            def served(batch):
                status, body = client.invoke(batch)
                if status != 200:
                    raise SystemExit(f"batch failed: {status} {body}")

            http_batches = [batch_throughput(served, records, b) for b in args.batch_sizes]
            load_between = os.getloadavg()
        finally:
            os.killpg(server.pid, signal.SIGTERM)  # the server and its uvicorn worker
            server.wait(timeout=60)

        import mlflow

        pyfunc = mlflow.pyfunc.load_model(model_uri)

        def in_process(batch):  # the same pyfunc (schema enforcement included), without HTTP and JSON
            pyfunc.predict(pd.DataFrame(batch))

        local_single = batch_throughput(in_process, records, 1, min_seconds=2.0, cpu=True)
        local_batches = [batch_throughput(in_process, records, b, cpu=True) for b in args.batch_sizes]

    result = {
        "what": "mlflow models serve --env-manager local (one uvicorn worker), POST /invocations, dataframe_records",
        "model": model,
        "history_ids_per_request": args.history,
        "top_k": cfg.mlflow.top_k,
        "server_startup_s": round(startup_s, 1),
        "single_request": single,
        "batch_throughput_http": http_batches,
        "in_process": {"single_row": local_single, "batches": local_batches},
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": {
                f"below {PARALLEL_ROWS} rows": serving_threads(1),
                f"from {PARALLEL_ROWS} rows": serving_threads(PARALLEL_ROWS),
            },
            "device": "cpu",
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_between_http_and_in_process": [round(x, 2) for x in load_between],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },  # fmt: skip
    }
    out = OUT.with_name("serving_history.json") if args.history else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
