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
- Writing the files of a logged model that a registered version serves (an artifact upload under
  `<experiment>/models/<model_id>/`) takes MANAGE on that registered model: EDIT on the experiment, which a
  trainer needs for its runs, would otherwise let it replace a registered model's code. (What is loaded is
  checked against its digest anyway: registry/integrity.py.)

    mlflow server --app-name contextual-bert-auth ...    # entry point in pyproject.toml (mlflow.app)

Needs what basic-auth needs: MLFLOW_AUTH_CONFIG_PATH, MLFLOW_FLASK_SERVER_SECRET_KEY and, at the first
start, MLFLOW_AUTH_ADMIN_PASSWORD (flows/infra/auth.py sets them for the stack).
"""

from __future__ import annotations

import re
import unicodedata

from contextual_bert.registry.promotion import CHAMPION, PREVIOUS

PROTECTED_ALIASES = frozenset({CHAMPION, PREVIOUS})
MANAGE, ADMIN = "manage", "admin"
# an artifact path under a logged model's files: <experiment id>/models/<model id>/...
_LOGGED_MODEL_FILES = re.compile(r"^(?:workspaces/[^/]+/)?\d+/models/([^/]+)(?:/|$)")


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


def registered_models_of_files(artifact_path: str | None) -> tuple[str, ...]:
    """The registered models whose versions serve the logged model whose files `artifact_path` (relative to the
    artifact root) lies under; () for any other path."""
    from mlflow.server.auth import _canonical_artifact_proxy_path
    from mlflow.server.handlers import _get_model_registry_store

    canonical = _canonical_artifact_proxy_path(artifact_path) if artifact_path else None  # None: MLflow refuses
    match = _LOGGED_MODEL_FILES.match(canonical.lstrip("/")) if canonical else None
    if match is None:
        return ()
    versions = _get_model_registry_store().search_model_versions(f"source_path = 'models:/{match.group(1)}'")
    return tuple(sorted({v.name for v in versions}))


def can_manage(username: str, name: str) -> bool:
    """MANAGE on registered model `name`, as basic-auth resolves it (grants, roles, default)."""
    from mlflow.server.auth import _get_role_permission_or_default, _role_permission_for
    from mlflow.server.handlers import _get_model_registry_store

    return _get_role_permission_or_default(
        _role_permission_for(
            username=username,
            resource_type="registered_model",
            resource_key=name,
            workspace_lookup_id=name,
            workspace_fetcher=_get_model_registry_store().get_registered_model,
            workspace_label="registered model",
        )
    ).can_manage


def _registered_files_rule(request) -> tuple[str, ...] | None:
    """An upload through Flask (multipart, or under --static-prefix) to a registered version's files."""
    if request.method not in ("PUT", "POST"):  # deleting artifacts takes MANAGE on the experiment already
        return None
    path = (request.view_args or {}).get("artifact_path") or request.args.get("path")
    return registered_models_of_files(path) or None


def _guard_native_uploads(auth_module) -> None:
    """MLflow serves artifact uploads (PUT) natively in FastAPI, past Flask's hooks: its permission middleware
    asks `_find_fastapi_validator` for each request; the validator it gets also needs MANAGE on the registered
    models whose files the upload would change. (Admins skip validators there, as in Flask.)"""
    import asyncio

    find = auth_module._find_fastapi_validator
    if getattr(find, "guards_registered_files", False):
        return
    prefixes = ("/api/2.0/mlflow-artifacts/artifacts/", "/ajax-api/2.0/mlflow-artifacts/artifacts/")

    def find_validator(path, method):
        validator = find(path, method)
        if validator is None or method != "PUT" or not path.startswith(prefixes):
            return validator

        async def guarded(username, request):
            if not await validator(username, request):
                return False
            relative = next(path.removeprefix(p) for p in prefixes if path.startswith(p))
            names = await asyncio.to_thread(registered_models_of_files, relative)
            return all([await asyncio.to_thread(can_manage, username, name) for name in names])

        return guarded

    find_validator.guards_registered_files = True  # type: ignore[attr-defined]
    auth_module._find_fastapi_validator = find_validator


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
        from mlflow.server.auth import (
            _is_proxy_artifact_path,
            authenticate_request,
            make_forbidden_response,
            sender_is_admin,
            validate_can_manage_registered_model,
        )

        # Runs after basic-auth's own hook: the request is authenticated and allowed by MLflow's rules by then.
        rule = routes.get((request.path, request.method))
        if rule is None and _is_proxy_artifact_path(request.path):
            rule = _registered_files_rule
        needed = rule(request) if rule is not None else None
        if needed is None or sender_is_admin():
            return None
        if needed == ADMIN:
            allowed = False
        elif needed == MANAGE:  # the registered model the request names
            allowed = validate_can_manage_registered_model()
        else:  # the registered models named by the rule
            allowed = all(can_manage(authenticate_request().username, name) for name in needed)
        return None if allowed else make_forbidden_response()

    return guard


def create_app():
    import mlflow.server.auth as auth_module
    from mlflow.server import app as flask_app

    served = auth_module.create_app(flask_app)  # under uvicorn a FastAPI app around the Flask one
    flask_app.before_request(_guard(route_rules()))
    _guard_native_uploads(auth_module)
    return served
