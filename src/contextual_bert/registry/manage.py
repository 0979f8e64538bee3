"""Who may write the registry's record: checked by `register` and `promote` before they write anything."""

from __future__ import annotations

from contextual_bert.errors import ContextualBertError


def require_manage(mlflow_client, name: str, command: str, why: str) -> None:
    """On an MLflow server with authentication, moving 'champion' and writing the registry's tags take MANAGE on
    the registered model (registry/auth_app.py): checked before anything is written, so a user without it
    changes nothing.
    No check against a file store or a server without the auth app (no user there)."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    uri = mlflow_client.tracking_uri
    if not uri.startswith(("http://", "https://")):
        return
    creds = get_default_host_creds(uri)
    user = creds.username
    if not user:
        return  # an authenticating server refuses every request of ours with 401 anyway
    resp = http_request(creds, "/api/2.0/mlflow/users/current", "GET", max_retries=2)
    if resp.status_code == 404:
        return  # a server without the auth app
    if resp.status_code == 401:
        raise ContextualBertError(f"MLflow server {uri} refused user '{user}' (HTTP 401: wrong password?)")
    if resp.status_code == 200 and resp.json().get("user", {}).get("is_admin"):
        return
    resp = http_request(
        creds,
        "/api/3.0/mlflow/users/permissions/get",
        "GET",
        max_retries=2,
        params={"username": user, "resource_type": "registered_model", "resource_id": name},
    )
    permission = resp.json().get("permission", "?") if resp.status_code == 200 else f"HTTP {resp.status_code}"
    if permission != "MANAGE":
        raise ContextualBertError(
            f"MLflow user '{user}' lacks MANAGE on registered model '{name}' (has {permission}), which `{command}` "
            f"needs {why}; run it as a user who may promote (the stack's 'promoter')"
        )
