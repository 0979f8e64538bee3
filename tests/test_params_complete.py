"""params.yaml is where a user reads what can be set: every setting the config reads (contextual_bert.config.Config,
walked field by field) is written there, or shown in a commented-out example line, with a one-line comment."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel

from contextual_bert.config import ATTRIBUTE_SETTINGS, Config, ModelConfig, ModelOverrides, TrainConfig

REPO = Path(__file__).resolve().parents[1]
PARAMS = (REPO / "params.yaml").read_text().splitlines()
KEY = re.compile(r"^(\s*)(#\s*)?([A-Za-z_]\w*):(\s|$)")


def key_lines(lines: list[str]) -> dict[str, list[int]]:
    """Dotted key -> the lines that write it: a block-mapping key first, then commented-out examples of it."""
    stack: list[tuple[int, str]] = []
    found: dict[str, list[int]] = {}
    for i, line in enumerate(lines):
        match = KEY.match(line)
        if not match:
            continue
        indent, commented, key = len(match.group(1)), bool(match.group(2)), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        found.setdefault(".".join([k for _, k in stack] + [key]), []).append(i)
        if not commented:
            stack.append((indent, key))
    return found


def block(lines: list[str], i: int) -> str:
    """Line i and the lines under it (more indented, or comments): a key's whole text."""
    indent = len(lines[i]) - len(lines[i].lstrip())
    end = i + 1
    while end < len(lines) and lines[end].strip() and len(lines[end]) - len(lines[end].lstrip()) > indent:
        end += 1
    return "\n".join(lines[i:end])


def commented(lines: list[str], i: int) -> bool:
    """A one-line comment: after the value, or on the line above (a commented-out example is its own)."""
    text = lines[i].lstrip()
    own = text.split("#", 2)[-1].strip() if text.startswith("#") else text.partition("#")[2].strip()
    above = lines[i - 1].strip() if i else ""
    return bool(own) and not (text.startswith("#") and text.count("#") == 1) or above.startswith("#")


def model_of(annotation) -> tuple[type[BaseModel] | None, bool]:
    """The config section a field holds, and whether it is held per name (a dict of them)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is dict and args and model_of(args[1])[0]:
        return model_of(args[1])[0], True
    for arg in args:
        if model_of(arg)[0]:
            return model_of(arg)
    return None, False


def settings(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, type[BaseModel] | None, bool]]:
    out = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        sub, per_name = model_of(field.annotation)
        out.append((key, sub, per_name))
        if sub and not per_name:
            out += settings(sub, key + ".")
    return out


# Settings of a section not written as keys, and where they are documented instead.
ELSEWHERE = {
    "per_model": "per-model overrides of train and model keys (each documented there)",
    **{
        f"train.{s}": "set per model only, under per_model: (config.Config refuses it in train)"
        for s in ATTRIBUTE_SETTINGS
    },
    **{
        f"model.{s}": "set per model only, under per_model: (config.Config refuses it in model)"
        for s in ATTRIBUTE_SETTINGS
    },
}


def missing_and_uncommented(lines: list[str]) -> tuple[list[str], list[str]]:
    found = key_lines(lines)
    missing, uncommented = [], []
    for key, sub, per_name in settings():
        if key in ELSEWHERE or any(key.startswith(k + ".") for k in ELSEWHERE):
            continue
        parent = key.rsplit(".", 1)[0]
        if "." in key and parent in found and _inline(lines, found[parent][0]):
            # a key of a section written on one line ({enabled: true, ...}): named in that line
            if not re.search(rf"\b{key.rsplit('.', 1)[1]}:", lines[found[parent][0]]):
                missing.append(key)
            continue
        if key not in found:
            missing.append(key)
            continue
        if not (sub and not per_name) and not commented(lines, found[key][0]):  # a section: its keys say it
            uncommented.append(key)
        if per_name:  # each field of a section held per name is named in the key's text (an example, a comment)
            text = "\n".join(block(lines, i) for i in found[key])
            missing += [f"{key}.<name>.{f}" for f in sub.model_fields if not re.search(rf"\b{f}\b", text)]
    return missing, uncommented


def _inline(lines: list[str], i: int) -> bool:
    return bool(re.match(r"^\s*(#\s*)?\w+:\s*\{", lines[i]))


def test_every_setting_is_in_params_yaml_with_a_comment():
    missing, uncommented = missing_and_uncommented(PARAMS)
    assert not missing, f"params.yaml does not write (or show in a commented-out example) {missing}"
    assert not uncommented, f"params.yaml writes {uncommented} without a one-line comment"


def test_a_per_model_override_is_a_train_or_model_setting_documented_there():
    own = set(TrainConfig.model_fields) | set(ModelConfig.model_fields)
    assert set(ModelOverrides.model_fields) - own <= set(ATTRIBUTE_SETTINGS)
    per_model_block = block(PARAMS, key_lines(PARAMS)["per_model"][0])
    assert all(s in per_model_block for s in ATTRIBUTE_SETTINGS), "the models' own settings are explained there"


def test_the_check_fails_on_a_dropped_setting_or_comment():
    dropped = [line for line in PARAMS if not line.strip().startswith("patience:")]
    assert "train.patience" in missing_and_uncommented(dropped)[0]
    bare = [line.split("#")[0].rstrip() if line.strip().startswith("patience:") else line for line in PARAMS]
    assert "train.patience" in missing_and_uncommented(bare)[1]


# Written into params.yaml with their defaults (issue 92): the config read is the same without them, so no
# stage's result changes (dvc.lock's params of the stages that list their sections were updated, not re-run).
ADDED_WITH_DEFAULTS = ["planted.hidden_taste_strength", "features.min_text_count", "features.max_text_words"]


def test_settings_added_with_their_defaults_change_nothing(tmp_path):
    import yaml

    from contextual_bert.config import load_config

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for key in ADDED_WITH_DEFAULTS:
        section, name = key.split(".")
        del params[section][name]
    without = tmp_path / "params.yaml"
    without.write_text(yaml.safe_dump(params))
    assert load_config(without) == load_config(REPO / "params.yaml")


# Options off by default that only a study turned on, kept in the product (issue 92): each with its reason.
GRADUATED = ["model.bag_path", "train.init_embeddings", "model.history_pooling"]


def test_an_option_only_a_study_turned_on_has_its_reason_in_decisions_md():
    decisions = (REPO / "docs" / "decisions.md").read_text().splitlines()
    settings_lines = [line for line in decisions if line.startswith("- **Setting:**")]
    for key in GRADUATED:
        assert sum(f"`{key}`" in line for line in settings_lines) >= 2, f"docs/decisions.md: no reason for {key}"
