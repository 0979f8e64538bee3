"""A registered version is what was registered: its files' digest, recorded at `register`, checked before
anything of it is loaded (by `promote` and by the serving gate).

Why: a trainer holds EDIT on the experiment, and EDIT covers the logged model's artifacts (an artifact PUT
through the MLflow server replaces a file of a registered model, its code included). What such a user cannot
do, under the `contextual-bert-auth` app (registry/auth_app.py), is write a registered model's or version's
tags: those take MANAGE, which only the promoter (and admin) holds. So `register`, run as the promoter,
records in version tag `artifacts_sha256` a digest of every file of the model as stored; a loader downloads
the files, recomputes it, and loads from that verified local copy only (never from the store again, which
could have changed meanwhile). A mismatch, or no digest, refuses the version with one line.

The digest is SHA-256 over a sorted manifest of (relative path, SHA-256 of the file): unlike
`tracking.directory_sha256` (paths and contents in one stream, used for lineage), bytes cannot be moved
from one file into another without changing it.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from contextual_bert.data.feature_store import file_sha256
from contextual_bert.errors import ContextualBertError

DIGEST_TAG = "artifacts_sha256"  # version tag: manifest_sha256 of the model's files, set at register


class IntegrityError(ContextualBertError):
    """A registered version's files differ from what was registered, or carry no digest to check."""


def manifest(directory: Path) -> dict[str, str]:
    """SHA-256 of every file under `directory`, by relative path."""
    directory = Path(directory)
    return {p.relative_to(directory).as_posix(): file_sha256(p) for p in sorted(directory.rglob("*")) if p.is_file()}


def manifest_sha256(directory: Path) -> str:
    lines = "".join(f"{path}\0{sha}\n" for path, sha in sorted(manifest(directory).items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def files_uri(mlflow_client, model_id: str) -> str:
    """Where a logged model's files are stored (what a version whose source is models:/<model_id> serves)."""
    return mlflow_client.get_logged_model(model_id).artifact_location


def version_files_uri(mlflow_client, name: str, version) -> str:
    """Where a registered version's files are stored."""
    if version.model_id:  # not every store returns it: then the registry's own answer
        return files_uri(mlflow_client, version.model_id)
    return mlflow_client.get_model_version_download_uri(name, version.version)


def download(uri: str, into: Path) -> Path:
    import mlflow

    return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(into)))


def verified_copy(mlflow_client, name: str, version, into: Path) -> Path:
    """A local copy of registered `version` of model `name`, checked against its recorded digest."""
    label = f"model '{name}' version {version.version}"
    recorded = (version.tags or {}).get(DIGEST_TAG)
    if not recorded:
        raise IntegrityError(
            f"{label} has no '{DIGEST_TAG}' tag, so what it holds cannot be checked; only a version registered "
            "by `contextual-bert register` as a user with MANAGE (the stack's promoter) is loaded"
        )
    local = download(version_files_uri(mlflow_client, name, version), into)
    found = manifest_sha256(local)
    if found != recorded:
        raise IntegrityError(
            f"{label}: its files changed after registration (digest {found[:12]}..., recorded {recorded[:12]}...); "
            "refused: nothing of it is loaded"
        )
    return local


def resolve_version(mlflow_client, name: str, reference: str):
    """The registered version a models:/ URI names: a version number or an @alias."""
    if reference.startswith("@"):
        return mlflow_client.get_model_version_by_alias(name, reference[1:])
    return mlflow_client.get_model_version(name, reference)


def load_verified_pyfunc(mlflow_client, name: str, version, into: Path):
    """The version's pyfunc, loaded from its verified copy under `into` (its code runs only after the check;
    `into` must outlive the model where it reads files after loading)."""
    import mlflow.pyfunc

    return mlflow.pyfunc.load_model(str(verified_copy(mlflow_client, name, version, into)))


def stored_digest(uri: str, expected: dict[str, str]) -> str:
    """The digest to record for a model's files as stored at `uri`, once the files named in `expected`
    (relative path -> SHA-256: the checkpoint, the code) are checked to be the ones the registering party
    logged: trainers may write the stored files, so they are compared before they are vouched for."""
    with tempfile.TemporaryDirectory() as tmp:
        local = download(uri, Path(tmp))
        found = manifest(local)
        changed = sorted(path for path, sha in expected.items() if found.get(path) != sha)
        if changed:
            raise IntegrityError(
                f"{uri}: {', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''} differ "
                "from what was logged; not registered"
            )
        return manifest_sha256(local)
