"""Flow parameters written into params.yaml: kept comments, validated, only real changes."""

from __future__ import annotations

import pytest

from contextual_bert.config import load_config
from contextual_bert.errors import ContextualBertError
from flows.params_file import apply_overrides, pipeline_overrides
from flows_testkit import REPO


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text((REPO / "params.yaml").read_text())
    return path


def test_overrides_land_in_params_yaml_with_its_comments(params):
    before = params.read_text()
    changed = apply_overrides(params, {"generate.size": "tiny", "train.seeds": [0], "train.max_epochs": 2})
    assert changed == {"generate.size": "tiny", "train.seeds": [0], "train.max_epochs": 2}
    cfg = load_config(params)
    assert (cfg.generate.size, cfg.train.seeds, cfg.train.max_epochs) == ("tiny", [0], 2)
    after = params.read_text()
    comments = [line.split("#", 1)[1] for line in before.splitlines() if "#" in line]
    assert all(c in after for c in comments), "a comment of params.yaml was lost"
    assert len(after.splitlines()) == len(before.splitlines())


def test_unchanged_values_leave_the_file_untouched(params):
    apply_overrides(params, {"generate.size": "tiny"})
    mtime, text = params.stat().st_mtime_ns, params.read_text()
    assert apply_overrides(params, {"generate.size": "tiny"}) == {}
    assert (params.stat().st_mtime_ns, params.read_text()) == (mtime, text)


def test_a_bad_value_fails_with_the_configs_error_and_keeps_the_file(params):
    text = params.read_text()
    with pytest.raises(ContextualBertError, match=r"params\.yaml: 'generate'.*not one of"):
        apply_overrides(params, {"generate.size": "huge"})
    with pytest.raises(ContextualBertError, match="train.max_epochs"):
        apply_overrides(params, {"train.max_epochs": 0})
    assert params.read_text() == text
    assert not list(params.parent.glob("*.candidate"))


def test_an_unknown_section_is_refused(params):
    with pytest.raises(KeyError, match="no section 'trian'"):
        apply_overrides(params, {"trian.max_epochs": 3})


def test_named_parameters_become_dotted_keys():
    assert pipeline_overrides() == {}
    assert pipeline_overrides(size="tiny", source="hm", params={"train.seeds": [0]}) == {
        "ingest.source": "hm", "generate.size": "tiny", "train.seeds": [0]}
