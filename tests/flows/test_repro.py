"""flows/repro.py: the MLflow server that `make repro` puts in front of the SQLite store while trainings run
in parallel. (The pipeline flow itself, local fan-out included, is covered by test_flows_local.py.)"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest
from flows_testkit import REPO
from mlflow.tracking import MlflowClient

from contextual_bert.registry.tracking import artifact_location
from flows.infra.net import healthy
from flows.repro import mlflow_server_over


def test_the_server_writes_the_sqlite_store_and_its_artifacts_beside_it(tmp_path):
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    uri = f"sqlite:///{db}"
    with mlflow_server_over(uri, "outfits", tmp_path / "server.log") as served:
        assert served.startswith("http://127.0.0.1:")
        client = MlflowClient(served)
        experiment = client.get_experiment_by_name("outfits")
        # created before the server, with the location a plain `dvc repro` (SQLite, no server) gives it
        assert experiment.artifact_location == artifact_location(uri, "outfits")
        # two processes log at once through the server, as two trainings do
        script = (
            "import sys; from mlflow.tracking import MlflowClient; c = MlflowClient(sys.argv[1]);"
            "r = c.create_run(sys.argv[2]).info.run_id;"
            "[c.log_metric(r, 'loss', float(i), step=i) for i in range(30)]; c.set_terminated(r)"
        )
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, served, experiment.experiment_id],
                env={**os.environ, "MLFLOW_TRACKING_URI": served},
            )
            for _ in range(2)
        ]
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
    # the server is gone, the runs are in the SQLite file
    assert not healthy(f"{served}/health")
    with sqlite3.connect(db) as connection:
        runs = connection.execute("select count(*) from runs where status = 'FINISHED'").fetchone()[0]
        points = connection.execute("select count(*) from metrics where key = 'loss'").fetchone()[0]
    assert (runs, points) == (2, 60)
    assert (tmp_path / "server.log").exists()


def test_a_server_uri_is_used_as_it_is(tmp_path):
    with mlflow_server_over("http://mlflow.example:5000", "outfits", tmp_path / "server.log") as served:
        assert served == "http://mlflow.example:5000"
    assert not (tmp_path / "server.log").exists()


def test_the_readme_shows_the_table_the_pipeline_wrote():
    from flows.repro import TABLE1_BLOCK, readme_with_table1

    readme = (REPO / "README.md").read_text()
    table1 = (REPO / "reports" / "table1.md").read_text()
    assert all(marker in readme for marker in TABLE1_BLOCK)
    assert readme_with_table1(readme, table1) == readme, "README.md's Table 1 differs from reports/table1.md"
    changed = readme_with_table1(readme, table1.replace("| [None] |", "| [Nix] |"))
    assert changed != readme and "| [Nix] |" in changed  # the check can fail
    with pytest.raises(ValueError, match="more than once"):  # a stray second copy of the block's end
        readme_with_table1(readme + "\n" + TABLE1_BLOCK[1] + "\n", table1)


def test_the_readme_table_is_the_compact_one():
    from flows.repro import COMPACT_COLUMNS, compact_table1

    table1 = (REPO / "reports" / "table1.md").read_text()
    compact = compact_table1(table1)
    assert compact.splitlines()[0] == "| " + " | ".join(COMPACT_COLUMNS) + " |"
    assert "(paper)" not in compact and "Outfit dependence" not in compact
    with pytest.raises(ValueError, match="no column 'Recall@5 %'"):
        compact_table1(table1.replace("Recall@5 %", "Recall at 5"))


@pytest.mark.slow
def test_a_failed_stage_ends_make_repro_with_a_few_lines_not_a_traceback(prefect_server, toy_repo):
    """A stage that crashes after Table 1 was written: the console gets the stage, its error line, the log and
    Table 1's path; the tracebacks (the stage's, Prefect's) go to the log only."""
    log = prefect_server.home / "repro.log"  # make repro's log: $PREFECT_HOME/repro.log
    env = prefect_server.env(TOY_FAIL="promote")
    run = subprocess.run([sys.executable, "-m", "flows.repro", "--workdir", str(toy_repo), "--max-parallel", "1"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    console = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode == 1, "\n".join(console[-40:])
    start = next((i for i, line in enumerate(console) if "make repro: stage 'promote' failed" in line), None)
    assert start is not None, "\n".join(console)
    block = console[start:]
    assert len(block) <= 6, block
    assert block[1] == "  error: RuntimeError: toy promote failed on purpose:"
    assert f"traceback included: {log}" in block[2]
    assert block[3] == "  Table 1, written before the failure: reports/table1.md"
    assert not [line for line in console if "Traceback" in line or "detail 3" in line], console
    assert len(console) <= 20, console  # a line per stage and training before it
    assert "Traceback" in log.read_text() and "detail 39" in log.read_text()
