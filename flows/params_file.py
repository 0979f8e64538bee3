"""Flow parameters become params.yaml values, so DVC (not Prefect) sees and records them.

A deployment parameter such as `size: tiny` is written into params.yaml before `dvc repro`, just as
`dvc exp run --set-param generate.size=tiny` would: DVC then re-runs exactly the stages whose params
changed, and dvc.lock records what was run. Comments and key order are kept (ruamel round trip).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from contextual_bert.config import load_config
from contextual_bert.errors import ContextualBertError


def _yaml() -> YAML:
    y = YAML()  # round trip: keeps comments, order and flow style
    y.preserve_quotes = True
    y.width = 120
    return y


def set_dotted(tree: dict, key: str, value: Any) -> None:
    """`set_dotted(t, "generate.size", "tiny")` sets t["generate"]["size"]; the sections must exist."""
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"params.yaml has no section '{key.rsplit('.', 1)[0]}' (from '{key}')")
        node = node[part]
    if not isinstance(node, dict):
        raise KeyError(f"params.yaml: '{key}' does not name a key inside a section")
    node[leaf] = _flow_style(value)


def _flow_style(value: Any) -> Any:
    """Lists and mappings written inline, `[0, 1]`, as params.yaml writes them."""
    if isinstance(value, (list, tuple)):
        seq = CommentedSeq(_flow_style(v) for v in value)
        seq.fa.set_flow_style()
        return seq
    if isinstance(value, dict):
        mapping = CommentedMap((k, _flow_style(v)) for k, v in value.items())
        mapping.fa.set_flow_style()
        return mapping
    return value


def apply_overrides(params_path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """Write the dotted-key overrides into params.yaml; return those that changed a value.

    The result is validated with the pipeline's own config model before it is written, so a bad value
    fails here, with the config's one-line error, and leaves the file as it was.
    """
    params_path = Path(params_path)
    if not overrides:
        return {}
    y = _yaml()
    tree = y.load(params_path.read_text())
    changed = {}
    for key, value in overrides.items():
        before = _get(tree, key)
        set_dotted(tree, key, value)
        if before != value:
            changed[key] = value
    if not changed:
        return {}
    buf = io.StringIO()
    y.dump(tree, buf)
    candidate = params_path.with_name(params_path.name + ".candidate")
    candidate.write_text(buf.getvalue())
    try:
        load_config(candidate)
    except ContextualBertError as exc:
        raise ContextualBertError(str(exc).replace(str(candidate), str(params_path))) from None
    finally:
        text = candidate.read_text()
        candidate.unlink()
    params_path.write_text(text)
    return changed


def _get(tree: dict, key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def pipeline_overrides(
    size: str | None = None, source: str | None = None, params: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The overrides a pipeline run asks for: named parameters first, then free `params`."""
    overrides: dict[str, Any] = {}
    if source is not None:
        overrides["ingest.source"] = source
    if size is not None:
        overrides["generate.size"] = size
    overrides.update(params or {})
    return overrides
