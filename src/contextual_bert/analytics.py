"""Every library's usage reporting off, in one place: a pipeline process never calls home.

MLflow 3's telemetry client is not only a network call: it sets and pops `_MLFLOW_TELEMETRY_SESSION_ID` in
`os.environ` from its own threads, racing a tracking request that reads the environment; without a network a
training's `log-batch` failed on that race (issue 68). The libraries read these variables when they are
imported, so `off()` runs on importing this package (`contextual_bert/__init__.py`), before any of them, and
its variables reach every process a stage, a flow or the stack starts (they inherit the environment).
`setdefault`: a user who sets one of them keeps their value. Torch-free and import-free on purpose.
"""

from __future__ import annotations

import os

OFF = {
    "MLFLOW_DISABLE_TELEMETRY": "true",  # mlflow.telemetry: no client, no consumer threads
    "GX_ANALYTICS_ENABLED": "false",  # Great Expectations' usage statistics
    "DVC_NO_ANALYTICS": "1",  # DVC's (also `core.analytics = false` in .dvc/config, for a bare `dvc`)
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # Prefect server's heartbeat (it also locked SQLite)
}


def off() -> None:
    for name, value in OFF.items():
        os.environ.setdefault(name, value)
