"""`make repro`: the whole pipeline on this machine, its cores all used.

`dvc repro` runs one stage at a time, and one training uses a 2-core CPU poorly (a second torch thread
adds ~10% on these small matrices, and when anything else runs beside it, the two threads wait on each
other: 10-20x slower). So the trainings run as units of the pipeline flow (`fan_out="local"`: each in its
own checkout, as `flows/pipeline.py` describes), `max_parallel` at a time with cores / max_parallel torch
threads each (OMP_NUM_THREADS; train.num_threads, when set, wins), and DVC still decides what is stale
and records every result in dvc.lock: a later `dvc repro` finds nothing to do.

Several processes must not write one SQLite file at once (MLflow's advice), so for the run's duration an
MLflow server (`--workers 1`) serves the params' SQLite store; the experiment is created first with its
artifacts beside the database, exactly where a plain `dvc repro` puts them.

    python -m flows.repro [--max-parallel N]          # what `make repro` runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

# Prefect's temporary API server gets 20 s to start, too few on a 2-core machine that is busy.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from contextual_bert.config import load_config  # noqa: E402
from flows import one_line_errors  # noqa: E402
from flows.pipeline import is_server, pipeline, tracking_uri  # noqa: E402
from flows.infra.net import free_port, wait_healthy  # noqa: E402
from flows.infra.stack import BIN  # noqa: E402


@contextmanager
def mlflow_server_over(uri: str, experiment: str, log: Path):
    """Yield an http:// URI that serves the SQLite store `uri` (yield `uri` itself when it is already a
    server); the server is stopped on exit."""
    if is_server(uri) or not uri.startswith("sqlite:///"):
        yield uri
        return
    from mlflow.tracking import MlflowClient

    from contextual_bert.tracking import experiment_id

    experiment_id(MlflowClient(uri), experiment)  # created with its artifact location, before the server
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        server = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{url}/health", 180, f"mlflow server (log: {log})", lambda: server.poll() is None)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


@one_line_errors("python -m flows.repro")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.repro", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=".")
    parser.add_argument("--max-parallel", type=int, default=os.cpu_count() or 1,
                        help="trainings at once (default: one per core)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    cfg = load_config(workdir / "params.yaml")
    log = workdir / ".dvc" / "tmp" / "repro-mlflow-server.log"
    with mlflow_server_over(tracking_uri(workdir), cfg.mlflow.experiment, log) as uri:
        os.environ["MLFLOW_TRACKING_URI"] = uri
        result = pipeline(workdir=str(workdir), fan_out="local", max_parallel=args.max_parallel)
    print(json.dumps(result, indent=2))
    return 0 if not result["stale"] else 1


if __name__ == "__main__":
    sys.exit(main())
