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

It prints a line per stage and per finished training (n of N, its validation CE and time) and warnings; the
whole log, every stage's output included, goes to $PREFECT_HOME/repro.log (.prefect/repro.log).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

# Prefect's temporary API server gets 20 s to start, too few on a 2-core machine that is busy.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from contextual_bert.config import load_config  # noqa: E402
from flows import failure_block, one_line_errors  # noqa: E402
from flows.infra.net import free_port, wait_healthy  # noqa: E402
from flows.infra.stack import BIN  # noqa: E402
from flows.pipeline import is_server, pipeline, progress, tracking_uri  # noqa: E402


@contextmanager
def mlflow_server_over(uri: str, experiment: str, log: Path):
    """Yield an http:// URI that serves the SQLite store `uri` (yield `uri` itself when it is already a
    server); the server is stopped on exit."""
    if is_server(uri) or not uri.startswith("sqlite:///"):
        yield uri
        return
    from mlflow.tracking import MlflowClient

    from contextual_bert.registry.tracking import experiment_id

    experiment_id(MlflowClient(uri), experiment)  # created with its artifact location, before the server
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        server = subprocess.Popen(
            [
                str(BIN / "mlflow"),
                "server",
                "--backend-store-uri",
                uri,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
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


TABLE1_BLOCK = ("<!-- table1: reports/table1.md -->", "<!-- /table1 -->")  # README.md's copy of Table 1


# The columns a reader compares; the full table (CIs, parameters, convergence, outfit dependence) stays in table1.md.
COMPACT_COLUMNS = (
    "Model",
    "Cross-entropy",
    "Recall@1 %",
    "Recall@5 %",
    "FITB easy % [95% CI]",
    "Against its yardstick (CE)",
)


def compact_table1(table1: str) -> str:
    """Table 1's main table with COMPACT_COLUMNS only, and the lines after it that say what it means (the seed
    SEs, the verdicts, the order), up to the next section."""
    lines = table1.strip().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| Model |"))
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    header = cells(lines[first])
    missing = [c for c in COMPACT_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"reports/table1.md: Table 1 has no column {missing[0]!r}")
    keep = [header.index(c) for c in COMPACT_COLUMNS]
    rows, i = [], first
    while i < len(lines) and lines[i].startswith("|"):
        row = cells(lines[i])
        rows.append("| " + " | ".join("---" if i == first + 1 else row[k] for k in keep) + " |")
        i += 1
    after = []
    for line in lines[i:]:
        if line.startswith("## "):
            break
        after.append(line)
    return "\n".join([*rows, *after]).strip()


def readme_with_table1(readme: str, table1: str) -> str:
    """README.md's text with the block between TABLE1_BLOCK's markers replaced by Table 1's compact form."""
    start, end = TABLE1_BLOCK
    twice = [marker for marker in TABLE1_BLOCK if readme.count(marker) > 1]
    if twice:
        raise ValueError(f"README.md has {twice[0]} more than once: one block of Table 1, one place")
    head, found, rest = readme.partition(start + "\n")
    _, found_end, tail = rest.partition(end)
    if not (found and found_end):
        raise ValueError(f"README.md has no block {start} ... {end}")
    return head + start + "\n" + compact_table1(table1) + "\n" + end + tail


def sync_readme(workdir: Path) -> None:
    """Copy reports/table1.md into README.md, so that the README's Table 1 is the one the pipeline computed."""
    readme = workdir / "README.md"
    table1 = workdir / load_config(workdir / "params.yaml").paths.reports_dir / "table1.md"
    if readme.exists() and table1.exists():
        text = readme_with_table1(readme.read_text(), table1.read_text())
        if text != readme.read_text():
            readme.write_text(text)
            progress.info("README.md: Table 1 updated from %s", table1.relative_to(workdir))


class _NotProgress(logging.Filter):
    """The console's handlers: not the progress lines (shown by their own handler), and no error of Prefect's or
    ours with its traceback (a failed stage ends the run with flows.failure_block; the log keeps them all)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(progress.name):
            return False
        failure = record.levelno >= logging.ERROR and (record.exc_info or record.name.startswith(("prefect", "flows")))
        return not failure


def quiet_console(log: Path) -> None:
    """The console shows the progress lines (flows.pipeline.progress) and warnings; every log record, DVC's
    and the stages' output included, goes to `log` as well."""
    import mlflow  # noqa: F401 - MLflow's and Prefect's own handlers first, so that they are the ones adjusted
    from prefect.logging.configuration import setup_logging

    setup_logging()
    log.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log, mode="w")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("", "uvicorn", "fastapi", "prefect.flow_runs", "prefect.task_runs", "mlflow"):
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.setLevel(logging.WARNING)
                handler.addFilter(_NotProgress())
        logger.addHandler(to_file)
    logging.getLogger().setLevel(logging.INFO)
    shown = logging.StreamHandler(sys.stdout)
    shown.setFormatter(logging.Formatter("%(asctime)s  %(message)s", "%H:%M:%S"))
    progress.addHandler(shown)
    progress.setLevel(logging.INFO)


def _shown(path: Path, workdir: Path) -> Path:
    """`path` as the user reads it: relative to the project when inside it."""
    return path.relative_to(workdir) if path.is_relative_to(workdir) else path


@one_line_errors("python -m flows.repro")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.repro", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=".")
    parser.add_argument(
        "--max-parallel", type=int, default=os.cpu_count() or 1, help="trainings at once (default: one per core)"
    )
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    cfg = load_config(workdir / "params.yaml")
    log = Path(os.environ.get("PREFECT_HOME", workdir / ".prefect")) / "repro.log"
    quiet_console(log)
    progress.info("make repro: the whole log goes to %s", log)
    server_log = workdir / ".dvc" / "tmp" / "repro-mlflow-server.log"
    table1 = cfg.paths.reports_dir / "table1.md"
    table1 = table1 if table1.is_absolute() else workdir / table1
    started = time.time()
    try:
        with mlflow_server_over(tracking_uri(workdir), cfg.mlflow.experiment, server_log) as uri:
            os.environ["MLFLOW_TRACKING_URI"] = uri
            result = pipeline(workdir=str(workdir), fan_out="local", max_parallel=args.max_parallel)
    except Exception as exc:  # noqa: BLE001 - a failed stage: a few lines here, the traceback in the log
        written = table1.exists() and table1.stat().st_mtime >= started
        block = failure_block("make repro", exc, _shown(log, workdir), _shown(table1, workdir) if written else None)
        if block is None:
            raise
        logging.getLogger("flows.repro").error("the pipeline failed", exc_info=exc)  # the log file only
        print(block, file=sys.stderr)
        return 1
    sync_readme(workdir)
    progress.info(
        "done: %d stages ran; DVC finds %s stale",
        len(result["ran"]) + len(result["trained"]),
        result["stale"] or "nothing",
    )
    return 0 if not result["stale"] else 1


if __name__ == "__main__":
    sys.exit(main())
