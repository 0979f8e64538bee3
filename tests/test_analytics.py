"""Every library's usage reporting is off in a pipeline process (contextual_bert.analytics): in particular no
MLflow telemetry client, whose threads raced a training's tracking requests (issue 68)."""

import os
import subprocess
import sys

from contextual_bert import analytics

# What makes MLflow 3 switch its telemetry off by itself (mlflow/telemetry/utils.py): a test or CI run. A user's
# process has none of them, so the child runs without them, as `make repro` does.
ITSELF_OFF = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "DO_NOT_TRACK", *analytics.OFF)

PROBE = """
import threading
{first}
import mlflow
from mlflow.telemetry import get_telemetry_client
at_import = get_telemetry_client() is not None
client = mlflow.MlflowClient(tracking_uri="sqlite:///{db}")
client.log_metric(client.create_run(client.create_experiment("x")).info.run_id, "loss", 1.0)
threads = [t.name for t in threading.enumerate() if "elemetry" in t.name]
print(at_import, get_telemetry_client() is not None, threads)
"""


def _probe(first: str, tmp_path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ITSELF_OFF}
    code = PROBE.format(first=first, db=tmp_path / "mlflow.db")
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.strip()


def test_a_pipeline_process_starts_no_mlflow_telemetry(tmp_path):
    assert _probe("import contextual_bert.cli", tmp_path) == "False False []"


def test_without_the_library_first_mlflow_would_start_its_telemetry(tmp_path):
    """The control: the probe above can fail (MLflow, left alone, makes a telemetry client on import; without
    a network it later drops it, which is when it popped the variable a request was reading)."""
    assert _probe("", tmp_path).startswith("True")


def test_a_users_own_setting_is_kept(monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "false")
    analytics.off()
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "false"


def test_every_prefect_command_of_the_makefile_runs_with_the_servers_analytics_off():
    # `make prefect-server` starts `prefect server start`, a process that never imports this package: the Makefile
    # passes the switch itself (a server left alone calls home, as its log showed)
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    env = next(line for line in makefile.splitlines() if line.startswith("PREFECT_ENV ="))
    assert f"PREFECT_SERVER_ANALYTICS_ENABLED={analytics.OFF['PREFECT_SERVER_ANALYTICS_ENABLED']}" in env
    commands = [line for line in makefile.splitlines() if "$(BIN)/prefect " in line]
    assert commands and all("$(PREFECT_ENV)" in line for line in commands), commands
