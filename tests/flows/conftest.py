"""Fixtures for the flow tests: a real Prefect server (once per session), workers, toy DVC projects.

Every process a test starts is ended by a finalizer, also when the test fails (see flows_testkit.Proc).
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from flows_testkit import SERVER_START_TIMEOUT, VENV_BIN, PrefectServer, Processes, free_port, make_toy_repo, wait_until


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real `prefect server start` on 127.0.0.1, a free port, SQLite in a temporary PREFECT_HOME."""
    home = tmp_path_factory.mktemp("prefect_home")
    processes = Processes(home / "logs")
    port = free_port()
    server = PrefectServer(f"http://127.0.0.1:{port}/api", home, processes)
    try:
        proc = processes.start(
            "server",
            # No scheduler: the nightly schedule must not start a run of its own while a test runs.
            [
                str(VENV_BIN / "prefect"),
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-ui",
                "--no-scheduler",
            ],
            home,
            server.env(),
        )

        def healthy() -> bool:
            if not proc.alive():
                raise RuntimeError(f"prefect server exited:\n{proc.tail()}")
            try:
                with urllib.request.urlopen(f"{server.url}/health", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until(healthy, SERVER_START_TIMEOUT, "prefect server health")
        yield server
    finally:
        processes.stop_all()


@pytest.fixture
def processes(tmp_path):
    """Background processes of one test (workers), ended at its teardown whatever happened."""
    procs = Processes(tmp_path / "logs")
    yield procs
    procs.stop_all()


@pytest.fixture
def prefect_api(prefect_server):
    """Point this process's flows at the session server (in-process flow runs)."""
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_server.url, PREFECT_HOME: prefect_server.home}):
        yield prefect_server
        APILogWorker.drain_all(timeout=10)  # send this test's flow logs while the server is up


@pytest.fixture
def toy_repo(tmp_path) -> Path:
    return make_toy_repo(tmp_path / "toy")
