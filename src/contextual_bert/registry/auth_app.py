"""The MLflow server app `contextual-bert-auth`: MLflow's basic-auth app plus the rules that keep the registry
the promoter's.

MLflow gives EDIT on a registered model everything but deleting it and managing permissions: its tags, its
aliases, its versions' tags and stages. EDIT is what a trainer holds, so under basic-auth alone a trainer
could move 'champion' (what customers are served), forge the tags promotion reads (validation metrics,
`rolled_back`, `champion_history`) or the digest that proves a version unchanged (registry/integrity.py).
This app keeps everything of basic-auth and adds, for every user but admin (answer 403, as MLflow's):

- MANAGE on the registered model is needed to: set or delete the aliases 'champion' and 'previous', in any
  spelling that reads as them (case, surrounding blanks or a trailing newline: `Champion`, `champion\\n`);
  set or delete any tag of the model or of its versions; create a version with tags; move a version to a
  legacy stage (promotion uses aliases only; a stage named "Production" would look like the champion);
  rename the model.
- Creating an experiment or a registered model is admin's (the stack's setup creates both): under
  basic-auth any authenticated user may, and becomes its MANAGE holder.

    mlflow server --app-name contextual-bert-auth ...    # entry point in pyproject.toml (mlflow.app)

Needs what basic-auth needs: MLFLOW_AUTH_CONFIG_PATH, MLFLOW_FLASK_SERVER_SECRET_KEY and, at the first
start, MLFLOW_AUTH_ADMIN_PASSWORD (flows/infra/auth.py sets them for the stack).
"""

from __future__ import annotations

import unicodedata

from contextual_bert.registry.promotion import CHAMPION, PREVIOUS

PROTECTED_ALIASES = frozenset({CHAMPION, PREVIOUS})
MANAGE, ADMIN = "manage", "admin"


def alias_key(alias) -> str:
    """How an alias reads to a person: compatibility-normalized, blanks stripped, case folded."""
    return unicodedata.normalize("NFKC", str(alias or "")).strip().casefold()


def _args(request) -> dict:
    body = request.get_json(silent=True)
    return {**request.args.to_dict(), **(body if isinstance(body, dict) else {})}


def _alias_rule(request) -> str | None:
    return MANAGE if alias_key(_args(request).get("alias")) in PROTECTED_ALIASES else None


def _version_create_rule(request) -> str | None:
    return MANAGE if _args(request).get("tags") else None


def _rules() -> dict:
    """Request message class -> a function of the request: MANAGE, ADMIN or None (basic-auth's rule alone)."""
    from mlflow.protos.model_registry_pb2 import (
        CreateModelVersion,
        CreateRegisteredModel,
        DeleteModelVersionTag,
        DeleteRegisteredModelAlias,
        DeleteRegisteredModelTag,
        RenameRegisteredModel,
        SetModelVersionTag,
        SetRegisteredModelAlias,
        SetRegisteredModelTag,
        TransitionModelVersionStage,
    )
    from mlflow.protos.service_pb2 import CreateExperiment

    always = {cls: (lambda request, rule=rule: rule) for cls, rule in (
        (SetModelVersionTag, MANAGE), (DeleteModelVersionTag, MANAGE), (SetRegisteredModelTag, MANAGE),
        (DeleteRegisteredModelTag, MANAGE), (TransitionModelVersionStage, MANAGE), (RenameRegisteredModel, MANAGE),
        (CreateExperiment, ADMIN), (CreateRegisteredModel, ADMIN),
    )}  # fmt: skip
    return {
        **always,
        SetRegisteredModelAlias: _alias_rule,
        DeleteRegisteredModelAlias: _alias_rule,
        CreateModelVersion: _version_create_rule,
    }


def route_rules() -> dict[tuple[str, str], object]:
    """(path, method) -> rule, for every path MLflow serves each message at (api/ajax-api, 2.0/3.0): built the
    way basic-auth builds its own table, so no spelling of a route is missed."""
    from mlflow.server.handlers import get_endpoints

    rules = _rules()
    ours = set(rules.values())  # an explicit endpoint comes with its view function, not our selector's pick
    return {
        (path, method): rule
        for path, rule, methods in get_endpoints(lambda request_class: rules.get(request_class))
        if rule in ours
        for method in methods
    }


def _guard(routes):
    def guard():
        from flask import request
        from mlflow.server.auth import make_forbidden_response, sender_is_admin, validate_can_manage_registered_model

        # Runs after basic-auth's own hook: the request is authenticated and allowed by MLflow's rules by then.
        rule = routes.get((request.path, request.method))
        needed = rule(request) if rule is not None else None
        if needed is None or sender_is_admin():
            return None
        if needed == ADMIN or not validate_can_manage_registered_model():
            return make_forbidden_response()
        return None

    return guard


def create_app():
    from mlflow.server import app as flask_app
    from mlflow.server.auth import create_app as basic_auth_app

    served = basic_auth_app(flask_app)  # under uvicorn a FastAPI app around the Flask one
    flask_app.before_request(_guard(route_rules()))
    return served
