"""Flow parameters become params.yaml values, so DVC (not Prefect) sees and records them, for that run only.

A deployment parameter such as `size: tiny` is written into params.yaml before `dvc repro`, just as
`dvc exp run --set-param generate.size=tiny` would: DVC then re-runs exactly the stages whose params
changed, and dvc.lock records what was run. A new value replaces the old one's text where it stands, so
every other line stays as written (a ruamel dump would re-wrap flow mappings and drop aligned comments);
a key that is not in the file yet joins its one-line flow mapping (`none: {learning_rate: 0.002}`), or else
is added by a ruamel round trip, which keeps comments and key order.

A run's overrides are its own (`one_off`): params.yaml is restored when the run ends, also when it fails, so
the next run (the nightly deployment) runs what params.yaml says; dvc.lock keeps the record of what ran, and
DVC re-runs those stages then.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import ScalarString

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
    patched = _patched_in_place(params_path.read_text(), changed)
    if patched is None or not _parses_to(patched, tree):
        buf = io.StringIO()
        y.dump(tree, buf)
        patched = buf.getvalue()
    candidate = params_path.with_name(params_path.name + ".candidate")
    candidate.write_text(patched)
    try:
        load_config(candidate)
    except ContextualBertError as exc:
        raise ContextualBertError(str(exc).replace(str(candidate), str(params_path))) from None
    finally:
        text = candidate.read_text()
        candidate.unlink()
    params_path.write_text(text)
    return changed


_PLAIN = re.compile(r"[^\s,\[\]{}#]+")  # a plain scalar as params.yaml writes them, in flow or block context


def _render(value: Any) -> str:
    """A value as one line of YAML: scalars plain where YAML reads them back unchanged, collections in flow style."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_render(v)}" for k, v in value.items()) + "}"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    text = str(value) if isinstance(value, (int, float)) else value
    return text if _PLAIN.fullmatch(text) and YAML(typ="safe").load(text) == value else json.dumps(value)


def _span(line: str, col: int) -> int | None:
    """Where the value starting at `col` ends: a plain scalar, or a flow collection closed on the same line."""
    if line[col] not in "[{":
        match = _PLAIN.match(line, col)
        return match.end() if match else None
    depth = 0
    for end in range(col, len(line)):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(line[end], 0)
        if depth == 0:
            return end + 1
    return None


def _patched_in_place(text: str, changed: dict[str, Any]) -> str | None:
    """`text` with each changed key's value rewritten where it stands (line and column from ruamel's parse),
    one key at a time; None when a key is new outside a one-line flow mapping, or its old value is quoted or
    spans lines (the caller then dumps the tree, and checks that a patched text parses to the intended tree)."""
    for key, value in changed.items():
        tree = _yaml().load(text)
        lines = text.splitlines(keepends=True)
        *parents, leaf = key.split(".")
        node = _get(tree, ".".join(parents)) if parents else tree
        if not isinstance(node, CommentedMap) or isinstance(node.get(leaf), ScalarString):
            return None
        if leaf in node:
            row, col = node.lc.value(leaf)
            end = _span(lines[row], col)
            new = _render(value)
        else:  # a new key of a one-line flow mapping, e.g. `none: {learning_rate: 0.002}`: added before its `}`
            if not parents or not node.fa.flow_style():
                return None
            owner = _get(tree, ".".join(parents[:-1])) if len(parents) > 1 else tree
            row, col = owner.lc.value(parents[-1])
            end = _span(lines[row], col)
            if end is None:
                return None
            inner = lines[row][col + 1 : end - 1].strip()
            new = "{" + (f"{inner}, " if inner else "") + f"{leaf}: {_render(value)}" + "}"
        if end is None:
            return None
        rest = lines[row][end:]
        gap = len(rest) - len(rest.lstrip(" "))
        if gap and rest.lstrip(" ").startswith("#"):  # an aligned comment keeps its column where it can
            rest = " " * max(1, gap + (end - col) - len(new)) + rest.lstrip(" ")
        lines[row] = lines[row][:col] + new + rest
        text = "".join(lines)
    return text


def _parses_to(text: str, tree: dict) -> bool:
    try:
        return _yaml().load(text) == tree
    except Exception:  # a patch that broke the YAML: the caller dumps the tree instead
        return False


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


LEFT_OVER = ".before-one-off-run"  # params.yaml as it was, while a run's overrides stand in it
log = logging.getLogger(__name__)


def restore_left_over(params_path: Path) -> bool:
    """Put back params.yaml as it was before a run that was killed before it could (its copy beside it)."""
    params_path = Path(params_path)
    kept = params_path.with_name(params_path.name + LEFT_OVER)
    if not kept.exists():
        return False
    log.warning("%s: restoring it as it was before an interrupted run's overrides (%s)", params_path, kept.name)
    params_path.write_bytes(kept.read_bytes())
    kept.unlink()
    return True


@contextmanager
def one_off(params_path: Path) -> Iterator[Path]:
    """params.yaml for one run: what the run writes into it (`apply_overrides`) is undone when the block ends, also
    on an error. A copy beside it (params.yaml.before-one-off-run) outlives a killed run; the next run restores it
    first."""
    params_path = Path(params_path)
    restore_left_over(params_path)
    original = params_path.read_bytes()
    kept = params_path.with_name(params_path.name + LEFT_OVER)
    kept.write_bytes(original)
    try:
        yield params_path
    finally:
        if params_path.read_bytes() != original:
            params_path.write_bytes(original)
        kept.unlink(missing_ok=True)
