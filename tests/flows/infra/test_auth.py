"""The stack's secrets file (flows/infra/auth.py): made once, 0600, reused; refused when others may read
it; the database URLs carry no password, the password file is private; the stack's client environment."""

from __future__ import annotations

import pytest

from flows.infra import auth, stack


def test_credentials_are_made_once_private_and_reused(tmp_path):
    creds = auth.credentials(tmp_path / "s")
    path = tmp_path / "s" / auth.CREDENTIALS
    assert path.stat().st_mode & 0o777 == 0o600
    assert set(auth.KEYS) <= set(creds) and len(set(creds.values())) == len(creds)
    assert all(len(v) >= 24 for v in creds.values())
    assert creds["PREFECT_AUTH_STRING"].startswith(f"{auth.PREFECT_USER}:")
    assert auth.credentials(tmp_path / "s") == creds  # read again, not regenerated

    text = path.read_text().replace(f"SERVING_TOKEN={creds['SERVING_TOKEN']}\n", "")
    path.write_text(text)  # a key missing from an older file is added, the others kept
    again = auth.credentials(tmp_path / "s")
    assert {k: v for k, v in again.items() if k != "SERVING_TOKEN"} == {
        k: v for k, v in creds.items() if k != "SERVING_TOKEN"
    }
    assert again["SERVING_TOKEN"] != creds["SERVING_TOKEN"]

    path.chmod(0o644)
    with pytest.raises(SystemExit, match="readable by others"):
        auth.credentials(tmp_path / "s")


def test_no_password_in_a_url_and_a_private_password_file(tmp_path):
    creds = auth.credentials(tmp_path)
    pg = stack.Postgres(tmp_path / "pg", 5433, creds["POSTGRES_PASSWORD"])
    for db, driver in (("prefect", "asyncpg"), ("mlflow", "psycopg2")):
        url = pg.url(db, driver)
        assert url == f"postgresql+{driver}://{db}@127.0.0.1:5433/{db}"
        assert not any(v in url for v in creds.values())
    pgpass = auth.write_pgpass(tmp_path, 5433, creds)
    assert pgpass.stat().st_mode & 0o777 == 0o600
    assert f"127.0.0.1:5433:mlflow:mlflow:{creds['MLFLOW_DB_PASSWORD']}" in pgpass.read_text()
    env = stack.mlflow_server_env(tmp_path, creds, pgpass)
    command = stack.mlflow_server_command(pg, 5000, str(tmp_path / "art"))
    assert "--app-name" in command and "127.0.0.1" in command
    assert not any(v in " ".join(command) for v in creds.values())  # no secret on a command line
    assert env["PGPASSFILE"] == str(pgpass) and env["MLFLOW_AUTH_ADMIN_PASSWORD"] == creds["MLFLOW_ADMIN_PASSWORD"]
    assert stack.client_env(creds, "trainer") == {
        "PREFECT_API_AUTH_STRING": creds["PREFECT_AUTH_STRING"],
        "MLFLOW_TRACKING_USERNAME": "trainer",
        "MLFLOW_TRACKING_PASSWORD": creds["MLFLOW_TRAINER_PASSWORD"],
    }
