"""The MLflow server app `contextual-bert-auth`: MLflow's basic-auth app plus one rule.

MLflow lets any user with EDIT on a registered model set or delete its aliases, and EDIT is what creating
a version takes; so a user who may register versions could also move 'champion', which is what customers
are served. This app keeps everything of basic-auth and adds: setting or deleting the aliases 'champion'
and 'previous', and renaming the registered model, need MANAGE on it (or admin). Answer: 403, as MLflow's.

    mlflow server --app-name contextual-bert-auth ...    # entry point in pyproject.toml (mlflow.app)

Needs what basic-auth needs: MLFLOW_AUTH_CONFIG_PATH, MLFLOW_FLASK_SERVER_SECRET_KEY and, at the first
start, MLFLOW_AUTH_ADMIN_PASSWORD (flows/infra/auth.py sets them for the stack).
"""

from __future__ import annotations

from contextual_bert.registry.promotion import CHAMPION, PREVIOUS

PROTECTED_ALIASES = frozenset({CHAMPION, PREVIOUS})
_ALIAS_PATH, _RENAME_PATH = "/registered-models/alias", "/registered-models/rename"


def _needs_manage(request) -> bool:
    path, method = request.path, request.method.upper()
    if path.endswith(_RENAME_PATH) and method == "POST":
        return True
    if path.endswith(_ALIAS_PATH) and method in ("POST", "DELETE"):
        args = {**request.args.to_dict(), **(request.get_json(silent=True) or {})}
        return args.get("alias") in PROTECTED_ALIASES
    return False


def _guard_protected_aliases():
    from flask import request
    from mlflow.server.auth import make_forbidden_response, sender_is_admin, validate_can_manage_registered_model

    # Runs after basic-auth's own hook: the request is authenticated and allowed EDIT by then.
    if _needs_manage(request) and not sender_is_admin() and not validate_can_manage_registered_model():
        return make_forbidden_response()
    return None


def create_app():
    from mlflow.server import app as flask_app
    from mlflow.server.auth import create_app as basic_auth_app

    served = basic_auth_app(flask_app)  # under uvicorn a FastAPI app around the Flask one
    flask_app.before_request(_guard_protected_aliases)
    return served
