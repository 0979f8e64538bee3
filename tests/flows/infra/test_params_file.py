"""Flow parameters written into params.yaml: kept comments, validated, only real changes."""

from __future__ import annotations

import logging

import pytest
from flows_testkit import REPO

from contextual_bert.config import load_config
from contextual_bert.errors import ContextualBertError
from flows.infra.params_file import LEFT_OVER, apply_overrides, one_off, pipeline_overrides


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


def test_only_the_lines_of_changed_values_change(params):
    """A value is rewritten where it stands: the other lines (flow mappings aligned by hand, `null`s, comment
    columns) stay byte for byte; a new key of a one-line flow mapping joins it (the sweep's
    `per_model.<model>.<key>`)."""
    before = params.read_text().splitlines()
    apply_overrides(
        params,
        {
            "generate.size": "tiny",
            "train.seeds": [0],
            "per_model.none.learning_rate": 0.01,
            "per_model.none.dropout": 0.2,
            "import_sets.customer_column": "customer",
        },
    )
    after = params.read_text().splitlines()
    assert len(after) == len(before)
    changed = {i: (b, a) for i, (b, a) in enumerate(zip(before, after)) if a != b}
    assert sorted(a.split("#")[0].strip() for _, a in changed.values()) == [
        "customer_column: customer",
        "none: {learning_rate: 0.01, dropout: 0.2}",
        "seeds: [0]",
        "size: tiny",
    ]
    size_before, size_after = next((b, a) for b, a in changed.values() if a.lstrip().startswith("size:"))
    assert size_after.index("#") == size_before.index("#")  # the comment keeps its column
    cfg = load_config(params)
    assert (cfg.model_for("none").dropout, cfg.train_for("none").learning_rate) == (0.2, 0.01)


def test_unchanged_values_leave_the_file_untouched(params):
    apply_overrides(params, {"generate.size": "tiny"})
    mtime, text = params.stat().st_mtime_ns, params.read_text()
    assert apply_overrides(params, {"generate.size": "tiny"}) == {}
    assert (params.stat().st_mtime_ns, params.read_text()) == (mtime, text)


def test_a_bad_value_fails_with_the_configs_error_and_keeps_the_file(params):
    text = params.read_text()
    with pytest.raises(ContextualBertError, match=r"params\.yaml: generate\.size 'huge' is not one of"):
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
        "ingest.source": "hm",
        "generate.size": "tiny",
        "train.seeds": [0],
    }


# --- a run's overrides are its own: params.yaml is restored when the run ends -------------------------------


def test_one_off_restores_params_yaml_after_the_run_and_after_a_failure(params):
    before = params.read_bytes()
    with one_off(params):
        apply_overrides(params, {"generate.size": "tiny"})
        assert load_config(params).generate.size == "tiny"
    assert params.read_bytes() == before
    with pytest.raises(RuntimeError), one_off(params):
        apply_overrides(params, {"train.max_epochs": 2})
        raise RuntimeError("a stage failed")
    assert params.read_bytes() == before
    assert not list(params.parent.glob("*" + LEFT_OVER))


def test_a_killed_runs_overrides_are_undone_by_the_next_run(params):
    before = params.read_bytes()
    kept = params.with_name(params.name + LEFT_OVER)
    kept.write_bytes(before)  # as a run leaves it when killed between its overrides and its end
    apply_overrides(params, {"generate.size": "tiny"})
    with one_off(params):
        assert params.read_bytes() == before
    assert params.read_bytes() == before and not kept.exists()


@pytest.mark.parametrize("fail", [False, True])
def test_the_pipeline_flow_leaves_params_yaml_as_it_found_it(params, monkeypatch, fail):
    """`make prefect-run SIZE=tiny`, `python -m flows.pipeline --set ...`: the run sees its overrides, the next
    run (the nightly deployment) what params.yaml says."""
    from flows import pipeline as flows_pipeline

    before = params.read_bytes()
    seen = {}

    def plan(workdir):
        seen["cfg"] = load_config(workdir / "params.yaml")
        return flows_pipeline.dvc_stages.Plan(before=("ingest",), units=(), after=())

    def run_series(stages, workdir):
        if fail:
            raise RuntimeError("stage ingest failed")
        return list(stages)

    monkeypatch.setattr(flows_pipeline, "apply_params", flows_pipeline.apply_params.fn)
    monkeypatch.setattr(flows_pipeline, "plan_stages", plan)
    monkeypatch.setattr(flows_pipeline, "_run_series", run_series)
    monkeypatch.setattr(flows_pipeline, "fan_out_units", lambda *a: [])
    monkeypatch.setattr(flows_pipeline, "_register_and_promote", lambda *a: [])
    monkeypatch.setattr(flows_pipeline, "final_status", lambda wd: {})
    monkeypatch.setattr("flows.tasks.get_run_logger", lambda: logging.getLogger(__name__))

    def run():
        return flows_pipeline.pipeline.fn(size="tiny", params={"train.seeds": [0]}, workdir=str(params.parent))

    if fail:
        with pytest.raises(RuntimeError, match="stage ingest failed"):
            run()
    else:
        assert run()["params_changed"] == {"generate.size": "tiny", "train.seeds": [0]}
    assert (seen["cfg"].generate.size, seen["cfg"].train.seeds) == ("tiny", [0])  # the run saw its overrides
    assert params.read_bytes() == before  # and left params.yaml as it was
