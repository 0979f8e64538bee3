"""The stack's secrets file (flows/infra/auth.py): made once, 0600, reused; refused when others may read
it; the database URLs carry no password, the password file is private; the stack's client environment."""

from __future__ import annotations

import os

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
    assert env["PGPASSFILE"] == str(pgpass)
    # The admin password is written into the auth database before the start, never into the environment.
    assert "MLFLOW_AUTH_ADMIN_PASSWORD" not in env and creds["MLFLOW_ADMIN_PASSWORD"] not in env.values()
    assert stack.client_env(creds, "trainer") == {
        "PREFECT_API_AUTH_STRING": creds["PREFECT_AUTH_STRING"],
        "MLFLOW_TRACKING_USERNAME": "trainer",
        "MLFLOW_TRACKING_PASSWORD": creds["MLFLOW_TRAINER_PASSWORD"],
    }


# --- the stack's files: no symbolic link, nobody else's, nothing open to others (issue 90, finding 4) ---------

OTHER_UID = 65534  # nobody: a user that is not this one


def _private(path, text="KEY=value\n"):
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_a_symlinked_secret_file_is_refused_and_its_target_untouched(tmp_path):
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    target = _private(tmp_path / "elsewhere.env")
    (root / auth.CREDENTIALS).symlink_to(target)
    with pytest.raises(SystemExit, match=f"^{root / auth.CREDENTIALS}: a symbolic link; refused"):
        auth.credentials(root)
    assert target.read_text() == "KEY=value\n"
    assert (root / auth.CREDENTIALS).is_symlink()


def test_a_symlinked_stack_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(SystemExit, match="link: a symbolic link; refused"):
        auth.credentials(tmp_path / "link")
    assert not any(real.iterdir())


def test_a_directory_or_secret_file_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root can give a directory to another user")
    # The attack of issue 90: another user made the directory, with a credentials.env of its own.
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    planted = _private(theirs / auth.CREDENTIALS)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(SystemExit, match=f"^{theirs}: a directory owned by uid {OTHER_UID}, not by this user"):
        auth.credentials(theirs)
    assert planted.read_text() == "KEY=value\n"  # no secret written into it
    assert sorted(p.name for p in theirs.iterdir()) == [auth.CREDENTIALS]

    # Our directory, their file in it.
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    planted = _private(mine / auth.CREDENTIALS)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(SystemExit, match=f"{auth.CREDENTIALS}: a file owned by uid {OTHER_UID}"):
        auth.credentials(mine)
    assert planted.read_text() == "KEY=value\n"


def test_a_directory_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(SystemExit, match="writable by others \\(mode 777\\); refused"):
        auth.credentials(shared)
    assert not any(shared.iterdir())


def test_secret_files_are_new_files_never_written_through_a_link(tmp_path):
    root = auth.private_dir(tmp_path / "s")
    assert root.stat().st_mode & 0o777 == 0o700
    target = _private(tmp_path / "victim")
    (root / auth.PGPASS).symlink_to(target)
    auth.write_pgpass(root, 5433, auth.credentials(root))
    assert target.read_text() == "KEY=value\n"  # the link was replaced, its target untouched
    assert not (root / auth.PGPASS).is_symlink() and (root / auth.PGPASS).stat().st_mode & 0o777 == 0o600
    assert (auth.write_auth_ini(root)).stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in root.iterdir()) == sorted([auth.CREDENTIALS, auth.PGPASS, auth.AUTH_INI])
