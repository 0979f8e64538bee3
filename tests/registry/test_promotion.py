"""Promotion: the paired test, the decision on the same validation cases, rollback."""

import json

import numpy as np
import pytest
import torch
from helpers import STRONG, WEAK
from helpers import with_registry_settings as _with

from contextual_bert.cli import main
from contextual_bert.data.feature_store import load_split
from contextual_bert.errors import ContextualBertError
from contextual_bert.registry.models import register_all
from contextual_bert.registry.promotion import (
    CHAMPION,
    PREVIOUS,
    aligned_hits,
    move_champion,
    paired_test,
    promote,
    recall_k,
    rollback,
    validation_cases,
)
from contextual_bert.registry.tracking import client


def _alias(mlflow_client, name, alias):
    try:
        return int(mlflow_client.get_model_version_by_alias(name, alias).version)
    except Exception:
        return None


# --- the paired test ---------------------------------------------------------------------------------------


def test_paired_test_counts_discordant_cases_and_is_one_sided():
    champion = np.array([True] * 10 + [False] * 90)
    candidate = np.array([True] * 10 + [True] * 20 + [False] * 70)
    test = paired_test(candidate, champion, margin=0.0, alpha=0.05)
    assert (test.candidate_only, test.champion_only, test.n_cases) == (20, 0, 100)
    assert test.difference == pytest.approx(0.2) and test.p_value == pytest.approx(0.5**20) and test.beats
    reverse = paired_test(champion, candidate, margin=0.0, alpha=0.05)
    assert reverse.p_value == pytest.approx(1.0) and not reverse.beats


def test_paired_test_needs_both_the_margin_and_significance():
    rng = np.random.default_rng(0)
    champion = rng.random(400) < 0.3
    candidate = champion.copy()
    flip = np.flatnonzero(~champion)[:6]  # six more hits: a small difference, not significant on its own
    candidate[flip] = True
    small = paired_test(candidate, champion, margin=0.0, alpha=0.05)
    assert small.difference > 0 and small.p_value == pytest.approx(0.5**6) and small.beats
    assert not paired_test(candidate, champion, margin=0.1, alpha=0.05).beats  # below the margin
    assert not paired_test(candidate, champion, margin=0.0, alpha=0.01).beats  # not significant enough
    same = paired_test(champion, champion, margin=0.0, alpha=0.05)
    assert same.p_value == 1.0 and not same.beats


def test_paired_test_refuses_cases_that_do_not_pair():
    with pytest.raises(ContextualBertError, match="same non-empty cases"):
        paired_test([True, False], [True], 0.0, 0.05)
    with pytest.raises(ContextualBertError, match="same non-empty cases"):
        paired_test([], [], 0.0, 0.05)


def test_cases_one_model_cannot_rank_are_its_misses():
    candidate = {("o1", 0): True, ("o1", 1): False, ("o2", 0): True}
    champion = {("o1", 0): False, ("o1", 1): True}  # ("o2", 0): an article it never saw
    a, b = aligned_hits(candidate, champion)
    assert a.tolist() == [True, False, True] and b.tolist() == [False, True, False]


def test_recall_k_reads_the_promotion_metric():
    assert recall_k("recall@5") == 5 and recall_k("recall@50") == 50
    with pytest.raises(ContextualBertError, match="not recall@K"):
        recall_k("mrr")


# --- promote and rollback --------------------------------------------------------------------------------


def test_promotion_needs_a_better_model_on_the_same_cases_and_rollback_restores_the_previous(tiny_trained_runs, capsys):
    name = "registry-promotion"
    base = tiny_trained_runs.cfg
    mlflow_client = client(base.mlflow)

    # 1. Only the weak model (near its random start): it counts worse than popularity on validation, so it is
    #    refused even with no champion, and says so; a champion from before the guard stands in for it below.
    weak_only = _with(base, name, [WEAK[0]])
    weak = register_all(weak_only)["versions"][0]["version"]
    first = promote(weak_only)
    guard = first["yardstick"]
    assert not first["promoted"] and guard["worse"] and guard["yardstick"] == "popularity"
    assert guard["candidate_val_cross_entropy"] > guard["yardstick_val_cross_entropy"]
    assert first["decision"].startswith(f"not promoted: version {weak} (none) counts worse than its yardstick")
    assert _alias(mlflow_client, name, CHAMPION) is None
    assert json.loads((base.paths.reports_dir / "promotion.json").read_text())["yardstick"]["worse"]
    assert json.loads(mlflow_client.get_model_version(name, str(weak)).tags["yardstick_guard"])["worse"]
    move_champion(mlflow_client, name, weak, None)

    # 2. The strong model is registered; a margin it cannot reach keeps the champion, and says why.
    both = _with(base, name, [STRONG[0], WEAK[0]], margin=0.9)
    strong = register_all(both)["versions"][0]["version"]
    # the champion as code before issue 92 registered it: its model named by a "variant" tag, no "model" tag
    mlflow_client.delete_model_version_tag(name, str(weak), "model")
    mlflow_client.set_model_version_tag(name, str(weak), "variant", WEAK[0])
    refused = promote(both)
    assert refused["champion_before"]["model"] == WEAK[0] and refused["candidate"]["model"] == STRONG[0]
    assert not refused["yardstick"]["worse"], refused["yardstick"]
    assert not refused["promoted"] and refused["candidate"]["version"] == strong
    assert refused["test"]["difference"] > 0 and refused["decision"].startswith("not promoted")
    assert _alias(mlflow_client, name, CHAMPION) == weak
    tags = mlflow_client.get_model_version(name, str(strong)).tags
    assert tags["promotion_decision"].startswith("not promoted") and float(tags["promotion_p_value"]) < 0.05

    # 3. With the params' margin it beats the champion on the validation cases: promoted, old one 'previous'.
    both = _with(base, name, [STRONG[0], WEAK[0]], margin=0.0)
    promoted = promote(both)
    assert promoted["promoted"] and promoted["test"]["p_value"] < 0.05
    assert not promoted["yardstick"]["worse"]  # the strong model counts better than popularity
    evaluation = json.loads((base.paths.reports_dir / "eval" / "global_state-s0.json").read_text())
    assert promoted["test"]["candidate_recall"] == pytest.approx(evaluation["val"]["recall@5"])
    assert promoted["test"]["n_cases"] == evaluation["val"]["n_cases"]
    assert (_alias(mlflow_client, name, CHAMPION), _alias(mlflow_client, name, PREVIOUS)) == (strong, weak)
    recorded = json.loads(mlflow_client.get_model_version(name, str(strong)).tags["promotion_test"])
    assert recorded["beats"] and recorded["n_cases"] == promoted["test"]["n_cases"]
    assert json.loads((base.paths.reports_dir / "promotion.json").read_text())["champion"] == strong

    # 4. Promoting again changes nothing.
    assert not promote(both)["promoted"] and _alias(mlflow_client, name, CHAMPION) == strong

    # 5. `contextual-bert promote --rollback` gives the champion back; the demoted version is not re-promoted.
    params = base.paths.reports_dir.parent / "promotion-params.yaml"
    import yaml

    raw = yaml.safe_load(tiny_trained_runs.params.read_text())
    raw["mlflow"]["model_name"] = name
    params.write_text(yaml.safe_dump(raw))
    assert main(["--params", str(params), "promote", "--rollback"]) == 0
    assert json.loads(capsys.readouterr().out)["champion"] == weak
    assert _alias(mlflow_client, name, CHAMPION) == weak and _alias(mlflow_client, name, PREVIOUS) is None
    assert mlflow_client.get_model_version(name, str(strong)).tags["rolled_back"] == "true"
    assert main(["--params", str(params), "promote"]) == 0
    assert _alias(mlflow_client, name, CHAMPION) == weak

    # 6. Nothing left to roll back to: a one-line error, exit 2.
    assert main(["--params", str(params), "promote", "--rollback"]) == 2
    assert "no 'previous' version" in capsys.readouterr().err


def test_promote_without_registered_versions_is_a_clear_error(tiny_project):
    cfg = _with(tiny_project.cfg, "registry-empty", [STRONG[0]])
    with pytest.raises(ContextualBertError, match="run `contextual-bert register` first"):
        promote(cfg)


def test_validation_cases_reencoded_from_validated_data_equal_the_stored_ones(tiny_trained_runs):
    """The path for a champion trained on other features reads the same cases the same way."""
    from contextual_bert.serving.completer import OutfitCompleterCore

    cfg = tiny_trained_runs.cfg
    core = OutfitCompleterCore.load(cfg.paths.models_dir / "global_state-s0" / "checkpoint.pt",
                                    cfg.paths.features_dir, device="cpu")  # fmt: skip
    stored = load_split(cfg.paths.features_dir, "val", core.max_set_size)
    reencoded = validation_cases(cfg, core, "other-features", "current-features")
    assert reencoded.outfit_ids == stored.outfit_ids
    assert torch.equal(reencoded.items, stored.items)
    assert reencoded.context.keys() == stored.context.keys()
    for name in stored.context:
        assert torch.equal(reencoded.context[name], stored.context[name]), name


def test_a_forged_metric_tag_changes_no_promotion(tiny_trained_runs):
    """The weak version's recorded validation recall forged to 0.99 (what a trainer could do where the auth app
    does not guard the tags): promote computes it, finds the record false, skips that version and promotes the
    strong one, as it would have without the forgery."""
    name = "registry-forged-metric"
    cfg = _with(tiny_trained_runs.cfg, name, [STRONG[0], WEAK[0]], margin=0.0)
    strong, weak = (e["version"] for e in register_all(cfg)["versions"])
    mlflow_client = client(cfg.mlflow)
    mlflow_client.set_model_version_tag(name, str(weak), "val/recall_at_5", "0.99")
    result = promote(cfg)
    assert result["promoted"] and result["candidate"]["version"] == strong, result["decision"]
    assert [s["version"] for s in result["skipped"]] == [weak]
    assert "is not what it computes now" in result["skipped"][0]["why"]
    assert _alias(mlflow_client, name, CHAMPION) == strong


def test_a_candidate_whose_files_changed_is_never_loaded(tiny_trained_runs, monkeypatch):
    """The strong version's stored code changed after registration: promote skips it without loading it, and
    rollback refuses to give 'champion' to it."""
    from pathlib import Path

    import mlflow.pyfunc

    from contextual_bert.registry.integrity import version_files_uri

    name = "registry-changed-files"
    cfg = _with(tiny_trained_runs.cfg, name, [STRONG[0]], margin=0.0)
    strong = register_all(cfg)["versions"][0]["version"]
    mlflow_client = client(cfg.mlflow)
    version = mlflow_client.get_model_version(name, str(strong))
    code = Path(version_files_uri(mlflow_client, name, version).removeprefix("file://")) / "pyfunc_model.py"
    code.write_text(code.read_text() + "\nraise SystemExit('the replaced code ran')\n")
    loaded = []
    load = mlflow.pyfunc.load_model
    monkeypatch.setattr(mlflow.pyfunc, "load_model", lambda *a, **k: loaded.append(a) or load(*a, **k))
    with pytest.raises(ContextualBertError, match=f"version {strong}: its files changed after registration"):
        promote(cfg)
    assert loaded == [] and _alias(mlflow_client, name, CHAMPION) is None
    # nor is 'champion' given back to a 'previous' whose files changed
    move_champion(mlflow_client, name, strong, None)
    move_champion(mlflow_client, name, strong, mlflow_client.get_model_version(name, str(strong)))
    with pytest.raises(ContextualBertError, match="its files changed after registration"):
        rollback(cfg)
    assert mlflow_client.get_model_version(name, str(strong)).tags.get("rolled_back") is None
