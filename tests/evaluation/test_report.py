import json
import math
import statistics

import pytest

from contextual_bert.config import Config
from contextual_bert.errors import DataError
from contextual_bert.evaluation.report import build_report
from contextual_bert.evaluation.report_stats import compare, mean_se

KS = [1, 2, 5, 10, 20, 50, 100, 250]
# Made-up test metrics per model and seed: [None] clearly worst, [C] within noise of [None] on
# recall@5, the others clearly better; by recall@1 GS > GSU, unlike the paper.
FAKE = {
    "none": {"cross_entropy": [5.30, 5.20, 5.25], "recall@1": [0.080, 0.090, 0.085], "recall@5": [0.20, 0.22, 0.21]},
    "concat": {"cross_entropy": [4.90, 5.00, 4.95], "recall@1": [0.100, 0.108, 0.104], "recall@5": [0.21, 0.22, 0.20]},
    "new_position": {
        "cross_entropy": [4.90, 4.96, 4.93],
        "recall@1": [0.104, 0.106, 0.105],
        "recall@5": [0.26, 0.27, 0.28],
    },
    "global_state": {
        "cross_entropy": [4.84, 4.86, 4.85],
        "recall@1": [0.130, 0.132, 0.131],
        "recall@5": [0.30, 0.31, 0.32],
    },
    "global_state_update": {
        "cross_entropy": [4.74, 4.76, 4.75],
        "recall@1": [0.120, 0.124, 0.122],
        "recall@5": [0.31, 0.32, 0.33],
    },
}
# The learned baselines: [None] beats the bag of items; the best context variant ([GSU] by cross-entropy)
# does not beat the bag of items with c on recall@5.
BASELINES = {
    "bag_of_items": {
        "cross_entropy": [5.50, 5.52, 5.48],
        "recall@1": [0.06, 0.061, 0.059],
        "recall@5": [0.15, 0.16, 0.14],
    },
    "bag_of_items_context": {
        "cross_entropy": [4.90, 4.91, 4.89],
        "recall@1": [0.11, 0.11, 0.11],
        "recall@5": [0.33, 0.34, 0.32],
    },
}
# Our own variant, not in the paper ([GS2]): best by recall@1 when it is trained.
OWN = {
    "global_state_two_way": {
        "cross_entropy": [4.69, 4.71, 4.70],
        "recall@1": [0.139, 0.141, 0.140],
        "recall@5": [0.33, 0.34, 0.35],
    }
}
PARAMETERS = {
    "none": 546_432,
    "concat": 673_664,
    "new_position": 640_768,
    "global_state": 723_328,
    "global_state_update": 921_856,
    "global_state_two_way": 1_120_768,
    "bag_of_items": 0,
    "bag_of_items_context": 94_336,
}


def _metrics(ce, r1, r5):
    return {
        "n_outfits": 100,
        "n_cases": 600,
        "n_unknown_targets": 3,
        "cross_entropy": ce,
        "recall@1": r1,
        "recall@5": r5,
        "recall@10": min(1, r5 * 1.3),
        "recall@50": min(1, r5 * 2),
        "recall@250": min(1, r5 * 3),
        "mrr": r1 * 1.5,
        "ndcg@10": r5 * 0.8,
    }


def _curve(r1, r5):
    return {"k": KS, "test": [min(1.0, r1 + (r5 - r1) * math.log(k) / math.log(5)) for k in KS]}


def fake_outfits(test, n_outfits=100):
    """A per-outfit record (bootstrap.outfit_record) matching `test`: 6 cases an outfit, the outfits' sums
    spread the same way for every model (w from 0.5 to 1.5, mean 1), so a better model is better on each."""
    cases = test["n_cases"] // n_outfits
    weights = [1 + ((j % 5) - 2) / 4 for j in range(n_outfits)]
    return {
        "outfit_id": [f"o{j}" for j in range(n_outfits)],
        "cases": [cases] * n_outfits,
        "sums": {m: [test[m] * cases * w for w in weights] for m in ("cross_entropy", "recall@1", "recall@5")},
    }


def write_fake_runs(root, seeds=(0, 1, 2), models=tuple(FAKE), with_outfits=False):
    cfg = Config.model_validate(
        {
            "paths": {
                "reports_dir": str(root / "reports"),
                "models_dir": str(root / "models"),
                "features_dir": str(root / "features"),
                "raw_dir": str(root / "raw"),
            },
            "train": {"models": list(models), "seeds": list(seeds)},
        }
    )
    (root / "reports" / "eval").mkdir(parents=True)
    for model in models:
        for i, seed in enumerate(seeds):
            numbers = {m: {**FAKE, **OWN, **BASELINES}[model][m][i] for m in ("cross_entropy", "recall@1", "recall@5")}
            test = _metrics(numbers["cross_entropy"], numbers["recall@1"], numbers["recall@5"])
            result = {
                "name": f"{model}-s{seed}",
                "model": model,
                "seed": seed,
                "parameters": PARAMETERS[model],
                "test": test,
                "val": test,
                "recall_curve": _curve(numbers["recall@1"], numbers["recall@5"]),
            }
            if with_outfits:
                result["test_outfits"] = fake_outfits(test)
            (root / "reports" / "eval" / f"{model}-s{seed}.json").write_text(json.dumps(result))
            run = root / "models" / f"{model}-s{seed}"
            run.mkdir(parents=True)
            end = numbers["cross_entropy"]
            history = [
                {
                    "epoch": e,
                    "train_loss": end + 1.5 / e + 0.2,
                    "val_cross_entropy": end + 1.5 / e - 0.3,
                    "learning_rate": 1e-3,
                    "samples_per_s": 5000.0,
                    "seconds": 3.0,
                }
                for e in range(1, 5 + i)
            ]
            (run / "curve.json").write_text(json.dumps(history))
    pop = _metrics(6.8, 0.01, 0.04)
    (root / "reports" / "eval" / "popularity.json").write_text(
        json.dumps(
            {
                "name": "popularity",
                "model": "popularity",
                "seed": None,
                "parameters": 0,
                "test": pop,
                "val": pop,
                "recall_curve": _curve(0.01, 0.04),
            }
        )
    )
    (root / "features").mkdir()
    (root / "features" / "manifest.json").write_text(
        json.dumps(
            {
                "source": "synthetic",
                "rows": {"outfits": 2000, "train": 1820, "val": 90, "test": 90, "customers": 300, "articles": 400},
                "n_items": 395,
                "d_context": 736,
            }
        )
    )
    return cfg


def se(values):
    return statistics.stdev(values) / math.sqrt(len(values))


def test_mean_se_and_compare():
    assert mean_se([1.0, 2.0, 3.0]) == {"mean": 2.0, "se": pytest.approx(1 / math.sqrt(3)), "n": 3}
    assert mean_se([4.0]) == {"mean": 4.0, "se": None, "n": 1}
    better = compare({"mean": 4.8, "se": 0.03}, {"mean": 5.0, "se": 0.04}, higher_is_better=False)
    assert better["improvement"] == pytest.approx(0.2) and better["se"] == pytest.approx(0.05)
    assert better["beats_by_more_than_se"] is True
    assert compare({"mean": 0.21, "se": 0.01}, {"mean": 0.2, "se": 0.01}, True)["beats_by_more_than_se"] is False
    assert compare({"mean": 0.3, "se": None}, {"mean": 0.2, "se": 0.01}, True)["beats_by_more_than_se"] is None


def test_compare_reads_one_seed_from_the_paired_bootstrap_and_more_seeds_from_the_se():
    test = {"n_cases": 600, "cross_entropy": 5.0, "recall@1": 0.1, "recall@5": 0.2}
    base, better = fake_outfits(test), fake_outfits(test | {"cross_entropy": 4.9})
    one = compare({"mean": 4.9, "se": None}, {"mean": 5.0, "se": None}, False, "cross_entropy", (better, base))
    assert one["yardstick"] == "paired bootstrap" and one["se"] is None and one["beats_by_more_than_se"] is True
    low, high = one["ci"]  # the improvement's interval: lower cross-entropy is better, so positive
    assert one["improvement"] == pytest.approx(0.1) and 0 < low <= one["improvement"] <= high
    same = compare({"mean": 5.0, "se": None}, {"mean": 5.0, "se": None}, False, "cross_entropy", (base, base))
    assert same["ci"] == [0.0, 0.0] and same["beats_by_more_than_se"] is False
    # two seeds a side: the SE rule, whatever the records say
    seeds = compare({"mean": 4.9, "se": 0.06}, {"mean": 5.0, "se": 0.08}, False, "cross_entropy", (better, base))
    assert seeds["yardstick"] == "se" and seeds["beats_by_more_than_se"] is False and "ci" not in seeds
    # one seed and nothing to pair: undetermined, and why
    alone = compare({"mean": 4.9, "se": None}, {"mean": 5.0, "se": None}, False, "cross_entropy", (better, None))
    assert alone["beats_by_more_than_se"] is None and alone["why"] == "n=1, no per-outfit cases"
    fewer = better | {"cases": [5] + better["cases"][1:]}
    mismatch = compare({"mean": 4.9, "se": None}, {"mean": 5.0, "se": None}, False, "cross_entropy", (fewer, base))
    assert mismatch["beats_by_more_than_se"] is None and "different cases of 1 test outfit(s)" in mismatch["why"]


def test_report_numbers_verdicts_and_files(tmp_path):
    cfg = write_fake_runs(tmp_path)
    result = build_report(cfg)
    reports = tmp_path / "reports"
    metrics = json.loads((reports / "metrics.json").read_text())

    gs = metrics["global_state"]["test"]
    assert gs["cross_entropy"]["mean"] == pytest.approx(4.85)
    assert gs["cross_entropy"]["se"] == pytest.approx(se(FAKE["global_state"]["cross_entropy"]))
    assert gs["recall@1"]["se"] == pytest.approx(se(FAKE["global_state"]["recall@1"]))
    assert metrics["global_state"]["parameters"] == 723_328
    assert metrics["popularity"]["test"]["recall@1"] == 0.01
    assert metrics["global_state_update"]["recall@1_gain_vs_none"] == pytest.approx(0.122 / 0.085 - 1)
    # [C]: recall@5 0.21 vs 0.21 -> not by more than the SE; the overall verdict is "no".
    assert metrics["concat"]["vs_none"]["recall@5"]["beats_by_more_than_se"] == 0
    assert metrics["new_position"]["vs_none"]["recall@5"]["beats_by_more_than_se"] == 1
    assert metrics["new_position"]["vs_none"]["cross_entropy"]["improvement"] == pytest.approx(5.25 - 4.93)
    assert result["all_beat_none_by_more_than_se"] is False

    def numbers_only(node):
        return (
            all(numbers_only(v) for v in node.values())
            if isinstance(node, dict)
            else isinstance(node, (int, float)) and not isinstance(node, bool)
        )

    assert numbers_only(metrics)

    assert result["order_by_recall@1"] == ["global_state", "global_state_update", "new_position", "concat"]
    assert result["order_matches_paper"] is False
    table = (reports / "table1.md").read_text()
    assert "| [GS] | 4.85 ± 0.01 | 4.85 | 13.10 ± 0.06 | 11.2 |" in table
    assert "| [None] | 5.25 ± 0.03 | 5.26 | 8.50 ± 0.29 | 8.5 |" in table
    assert "546,432" in table and "921,856" in table and "+43.5 %" in table
    assert "by more than the standard error: **no**" in table
    assert "Ours: [GS] > [GSU] > [NP] > [C]. Paper: [GSU] > [GS] > [NP] > [C]. **Different order.**" in table
    assert "[NP] vs [C]" in table  # recall@1 0.105 vs 0.103: within the SE of the difference
    assert "in-outfit" in table and "source **synthetic**, 2,000 outfits" in table
    for name in (
        "recall_at_k.png",
        "training_curves.png",
        "recall_at_k.json",
        "recall_at_k.csv",
        "training_curves.json",
    ):
        assert (reports / "plots" / name).stat().st_size > 0, name
    curve = json.loads((reports / "plots" / "recall_at_k.json").read_text())
    gs_at_1 = [row["recall"] for row in curve if row["model"] == "global_state" and row["k"] == 1]
    assert gs_at_1 == [pytest.approx(0.131)]
    assert {row["model"] for row in curve} == set(FAKE) | {"popularity"}


def test_a_variant_of_ours_is_a_row_without_the_papers_numbers_and_ranked_beside_its_order(tmp_path):
    cfg = write_fake_runs(tmp_path, models=("none", "new_position", "global_state_update", "global_state_two_way"))
    result = build_report(cfg)
    table = (tmp_path / "reports" / "table1.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| [GS2] |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1:5] == ["4.70 ± 0.01", "–", "14.00 ± 0.06", "–"]  # the paper's cells empty
    assert "1,120,768 | – |" in row and "+64.7 % | – |" in row  # its count, and its gain over [None]
    # the paper's variants in the paper's order: the same order, [GS2] ranked among them
    assert result["order_by_recall@1"] == ["global_state_two_way", "global_state_update", "new_position"]
    assert result["order_matches_paper"] is True
    assert "Ours: [GS2] > [GSU] > [NP]. Paper: [GSU] > [NP] ([GS2]: not in the paper). **Same order.**" in table
    assert json.loads((tmp_path / "reports" / "metrics.json").read_text())["global_state_two_way"]["parameters"] == (
        1_120_768
    )


def test_context_wins_by_more_than_se_when_it_does(tmp_path):
    cfg = write_fake_runs(tmp_path, models=("none", "global_state", "global_state_update"))
    result = build_report(cfg)
    assert result["all_beat_none_by_more_than_se"] is True
    assert "by more than the standard error: **yes**" in (tmp_path / "reports" / "table1.md").read_text()


def test_single_seed_says_no_se(tmp_path):
    cfg = write_fake_runs(tmp_path, seeds=(0,))
    result = build_report(cfg)
    table = (tmp_path / "reports" / "table1.md").read_text()
    assert "n=1, no SE" in table and "| [GS] | 4.84 | 4.85 |" in table
    assert "[GS]: cross-entropy better by +0.46: undetermined (n=1, no per-outfit cases)" in table
    assert result["all_beat_none_by_more_than_se"] is None
    assert "se" not in json.loads((tmp_path / "reports" / "metrics.json").read_text())["none"]["test"]["recall@1"]


def test_single_seed_verdicts_from_the_paired_bootstrap(tmp_path):
    cfg = write_fake_runs(tmp_path, seeds=(0,), models=("none", "concat", "global_state"), with_outfits=True)
    result = build_report(cfg)
    table = (tmp_path / "reports" / "table1.md").read_text()
    assert result["all_beat_none_by_more_than_se"] is True
    assert (
        "[None] on cross-entropy and recall@5 with the paired bootstrap's 95% interval of the difference "
        "above 0: **yes**" in table
    )
    assert "[C]: cross-entropy better by +0.40 (paired bootstrap 95% CI +0.3" in table
    assert "recall@5 better by +1.00 pts (paired bootstrap 95% CI +0." in table
    vs_none = json.loads((tmp_path / "reports" / "metrics.json").read_text())["concat"]["vs_none"]["recall@5"]
    assert vs_none["paired_bootstrap"] == 1 and vs_none["beats_by_more_than_se"] == 1 and "se" not in vs_none
    assert vs_none["improvement"] == pytest.approx(0.01) and 0 < vs_none["ci_low"] <= 0.01 <= vs_none["ci_high"]

    # [None]'s record has a case fewer in one outfit (say, a target it skips): no pairing, and the table says so
    path = tmp_path / "reports" / "eval" / "none-s0.json"
    none = json.loads(path.read_text())
    none["test_outfits"]["cases"][3] -= 1
    path.write_text(json.dumps(none))
    result = build_report(cfg)
    table = (tmp_path / "reports" / "table1.md").read_text()
    assert result["all_beat_none_by_more_than_se"] is None
    assert "undetermined (n=1, the two were measured on different cases of 1 test outfit(s))" in table


def test_missing_eval_or_history_is_a_clear_error(tmp_path):
    cfg = write_fake_runs(tmp_path)
    (tmp_path / "reports" / "eval" / "new_position-s1.json").unlink()
    with pytest.raises(DataError, match=r"new_position-s1\.json: evaluation result .*not found"):
        build_report(cfg)
    cfg = write_fake_runs(tmp_path / "again")
    (tmp_path / "again" / "models" / "concat-s2" / "curve.json").unlink()
    with pytest.raises(DataError, match=r"concat-s2/curve\.json: training curve"):
        build_report(cfg)


def test_recall_given_in_percent_is_rejected(tmp_path):
    cfg = write_fake_runs(tmp_path)
    path = tmp_path / "reports" / "eval" / "popularity.json"
    result = json.loads(path.read_text())
    result["test"]["recall@5"] = 4.0
    path.write_text(json.dumps(result))
    with pytest.raises(DataError, match=r"popularity\.json, column 'test.recall@5'.*fraction"):
        build_report(cfg)


def test_optimum_rows_convergence_and_learned_baselines(tmp_path):
    cfg = write_fake_runs(tmp_path, models=("none", "global_state_update", "bag_of_items", "bag_of_items_context"))
    eval_dir = tmp_path / "reports" / "eval"
    for name, ce, r1, r5 in (("optimum_context", 4.5, 0.15, 0.4), ("optimum_no_context", 5.0, 0.1, 0.3)):
        result = {
            "name": name,
            "model": name,
            "seed": None,
            "parameters": 0,
            "test": _metrics(ce, r1, r5),
            "val": _metrics(ce, r1, r5),
            "recall_curve": _curve(r1, r5),
        }
        (eval_dir / f"{name}.json").write_text(json.dumps(result))
    ways = {0: "early_stopping", 1: "plateau", 2: None}
    for model in ("none", "global_state_update", "bag_of_items", "bag_of_items_context"):
        for seed in (0, 1, 2):
            converged = ways[seed] if model == "none" else "plateau"
            (tmp_path / "models" / f"{model}-s{seed}" / "metrics.json").write_text(
                json.dumps({"converged": converged, "best_epoch": 4, "epochs": 6})
            )
    result = build_report(cfg)
    table = (tmp_path / "reports" / "table1.md").read_text()
    assert "| Optimum, with context | 4.50 | – | 15.00 |" in table
    assert "| Optimum, without context | 5.00 |" in table
    assert table.index("Optimum, with context") < table.index("| Popularity") < table.index("| [None]")
    assert "| 2/3 (early stop, plateau) |" in table and "| 3/3 (plateau) |" in table
    assert "[None]: +0.250 to the optimum, without context" in table  # 5.25 - 5.00
    assert "[GSU]: +0.250 to the optimum, with context" in table  # 4.75 - 4.50
    checks = result["vs_learned_baselines"]
    assert checks["none_vs_bag_of_items"]["cross_entropy"]["beats_by_more_than_se"] == 1
    assert checks["global_state_update_vs_bag_of_items_context"]["recall@5"]["beats_by_more_than_se"] == 0
    assert "[GSU] against Bag of items + c: cross-entropy better by +0.15" in table
    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())
    assert metrics["optimum_context"]["test"]["cross_entropy"] == 4.5 and metrics["none"]["converged_runs"] == 2
    # The baselines are not context variants of the paper: no "beats [None]" verdict for them.
    assert "bag_of_items" not in metrics["none"] and "vs_none" not in metrics["bag_of_items_context"]


def test_bootstrap_interval_column_and_the_no_context_note(tmp_path):
    cfg = write_fake_runs(tmp_path, seeds=(0, 1), models=("none",))
    for seed, interval in ((0, [0.15, 0.25]), (1, [0.17, 0.29])):
        path = tmp_path / "reports" / "eval" / f"none-s{seed}.json"
        result = json.loads(path.read_text())
        result["test_bootstrap"] = {"n_resamples": 1000, "level": 0.95, "unit": "test outfits", "recall@5": interval}
        path.write_text(json.dumps(result))
    manifest = tmp_path / "features" / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"source": "sets", "d_context": 0}))
    build_report(cfg)
    table = (tmp_path / "reports" / "table1.md").read_text()
    assert "| Recall@5 % 95% CI |" in table
    row = next(line for line in table.splitlines() if line.startswith("| [None] |"))
    assert "| 16.00–27.00 |" in row  # the seeds' bounds averaged
    assert "percentile bootstrap over the test outfits" in table
    assert "No context" in table and "only the models that read none run" in table


def test_attribute_models_are_read_against_the_attribute_aware_popularity(tmp_path):
    """ "_attrs" models: a row in Table 1, and a section with all / known / unseen targets against the
    attribute-aware popularity; the paper's verdicts ignore them."""
    cfg = write_fake_runs(tmp_path, seeds=(0, 1), models=("none", "global_state"))
    cfg = cfg.model_copy(
        update={
            "train": cfg.train.model_copy(
                update={"models": ["none", "global_state", "none_attrs", "global_state_attrs"]}
            )
        }
    )
    evals = tmp_path / "reports" / "eval"
    for model, shift in (("none_attrs", 0.0), ("global_state_attrs", -0.3)):
        for i, seed in enumerate((0, 1)):
            test = _metrics(4.0 + shift + i * 0.02, 0.2, 0.5 - shift)
            known, unseen = _metrics(3.5 + shift, 0.25, 0.6), _metrics(6.0 + i * 0.1, 0.01, 0.07)
            result = {
                "name": f"{model}-s{seed}",
                "model": model,
                "seed": seed,
                "parameters": 546_432,
                "test": test,
                "val": test,
                "test_known": known,
                "test_unseen": unseen,
                "test_unseen_bootstrap": {"recall@5": [0.03, 0.11]},
                "recall_curve": _curve(0.2, 0.5),
            }
            (evals / f"{model}-s{seed}.json").write_text(json.dumps(result))
            run = tmp_path / "models" / f"{model}-s{seed}"
            run.mkdir(parents=True)
            (run / "curve.json").write_text(json.dumps([{"epoch": 1, "train_loss": 5.0, "val_cross_entropy": 4.5}]))
    reference = _metrics(5.0, 0.05, 0.2)
    (evals / "popularity_attribute.json").write_text(
        json.dumps(
            {
                "name": "popularity_attribute",
                "test": reference,
                "test_known": reference,
                "test_unseen": reference,
                "recall_curve": _curve(0.05, 0.2),
            }
        )
    )
    build_report(cfg)
    table = (tmp_path / "reports" / "table1.md").read_text()
    assert "| Popularity by attribute | 5.00 |" in table and "| [None] + attributes | 4.01 ± 0.01 |" in table
    section = table[table.index("## Article attributes") :]
    assert "| [None] + attributes | 4.01 ± 0.01 | 50.00 ± 0.00 [–] | 3.50 ± 0.00 |" in section
    assert "6.05 ± 0.05 | 7.00 ± 0.00 [3.00–11.00]" in section
    assert "[None] + attributes against popularity by attribute (all targets): cross-entropy better by +0.99" in section
    # the context still helps with attributes (same cases), and what attributes add over ids only (known targets)
    assert "  - [GS] + attributes: cross-entropy better by +0.30 (SE 0.01): yes" in section
    none_ce = build_report(cfg)["summary"]["none"]["cross_entropy"]["mean"]
    assert f"  - [None] + attributes against [None]: cross-entropy better by {none_ce - 3.5:+.2f}" in section
    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())
    assert "none_attrs" not in metrics["global_state"].get("vs_none", {}) and "popularity_attribute" in metrics


def test_the_largest_seed_se_is_printed_to_three_decimals_as_computed(tmp_path):
    """Table 1 rounds to two decimals (0.022 shows as 0.02): a claim about the seed SE is read from this line."""
    cfg = write_fake_runs(tmp_path, models=("none", "global_state"))
    build_report(cfg)
    table = (tmp_path / "reports" / "table1.md").read_text()
    none_se, gs_se = se(FAKE["none"]["cross_entropy"]), se(FAKE["global_state"]["cross_entropy"])
    assert f"at most **{none_se:.3f}** nats ([None]); each: [None] {none_se:.3f}, [GS] {gs_se:.3f}." in table
    assert "[None] misses the 0.02 nats target: s0 5.300, s1 5.200, s2 5.250;" in table and "[GS] misses" not in table
    # a row over the target because one seed stopped early: its seeds, how each ended, the one furthest out
    evals = tmp_path / "reports" / "eval"
    result = json.loads((evals / "global_state-s2.json").read_text())
    result["test"]["cross_entropy"] = 4.95
    (evals / "global_state-s2.json").write_text(json.dumps(result))
    for seed, (best, ran, way) in enumerate([(4, 6, "plateau"), (6, 6, "plateau"), (2, 4, "early_stopping")]):
        (tmp_path / "models" / f"global_state-s{seed}" / "metrics.json").write_text(
            json.dumps({"converged": way, "best_epoch": best, "epochs": ran})
        )
    build_report(cfg)
    assert (
        "[GS] misses the 0.02 nats target: s0 4.840 (best epoch 4 of 6, plateau), s1 4.860 (best epoch 6 of 6, "
        "plateau), s2 4.950 (best epoch 2 of 4, early stop); s2 is 0.100 from the others' mean."
    ) in (tmp_path / "reports" / "table1.md").read_text()
    single = tmp_path / "single"
    single.mkdir()
    build_report(write_fake_runs(single, seeds=(0,)))
    assert "Seed SE of the test cross-entropy" not in (single / "reports" / "table1.md").read_text()


def test_outfit_dependence_column_flags_a_run_that_does_not_read_the_outfit(tmp_path):
    cfg = write_fake_runs(tmp_path, models=("none", "global_state"))
    dependence = {"none": [0.004, 0.001, 0.002], "global_state": [0.31, 0.29, 0.30]}  # [None] stuck at popularity
    for model, values in dependence.items():
        for seed, value in zip((0, 1, 2), values):
            path = tmp_path / "reports" / "eval" / f"{model}-s{seed}.json"
            result = json.loads(path.read_text())
            result["test"]["outfit_dependence"] = value
            path.write_text(json.dumps(result))
    build_report(cfg)
    table = (tmp_path / "reports" / "table1.md").read_text()
    rows = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| [")}
    assert "| 0.002 ± 0.001 **stuck** |" in rows["| [None]"]
    assert "| 0.300 ± 0.006 |" in rows["| [GS]"]
    assert "Outfit dependence |" in table and "| Popularity |" in table
    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())
    assert metrics["global_state"]["test"]["outfit_dependence"]["mean"] == pytest.approx(0.30)


def test_history_section_pairs_an_attribute_model_with_the_yardstick_on_its_known_targets(tmp_path):
    """An "_attrs" model ranks every test target, popularity + own history only those with an id: paired on all
    targets the cases differ (undetermined); its record of the known targets pairs with the yardstick's."""
    cfg = write_fake_runs(tmp_path, seeds=(0,), models=("none", "global_state"), with_outfits=True)
    cfg = cfg.model_copy(
        update={"train": cfg.train.model_copy(update={"models": ["none", "global_state", "global_state_attrs"]})}
    )
    evals = tmp_path / "reports" / "eval"
    reference = _metrics(5.0, 0.05, 0.2)
    (evals / "popularity_history.json").write_text(
        json.dumps(
            {
                "name": "popularity_history",
                "weight": 0.2,
                "test": reference,
                "val": reference,
                "test_outfits": fake_outfits(reference),
                "recall_curve": _curve(0.05, 0.2),
            }
        )
    )
    known = _metrics(4.5, 0.1, 0.3)
    test = _metrics(4.8, 0.1, 0.3) | {"n_cases": 700}  # the unseen targets are cases of their own
    result = {
        "name": "global_state_attrs-s0",
        "model": "global_state_attrs",
        "seed": 0,
        "parameters": 546_432,
        "test": test,
        "val": test,
        "test_known": known,
        "test_unseen": _metrics(7.0, 0.0, 0.01),
        "test_outfits": fake_outfits(test),
        "recall_curve": _curve(0.1, 0.3),
    }
    (evals / "global_state_attrs-s0.json").write_text(json.dumps(result | {"test_known_outfits": fake_outfits(known)}))
    run = tmp_path / "models" / "global_state_attrs-s0"
    run.mkdir(parents=True)
    (run / "curve.json").write_text(json.dumps([{"epoch": 1, "train_loss": 5.0, "val_cross_entropy": 4.9}]))
    build_report(cfg)
    section = (tmp_path / "reports" / "table1.md").read_text().split("## Does history help?")[1]
    assert "  - [GS] + attributes (known targets): cross-entropy better by +0.50 (paired bootstrap" in section
    assert "recall@5 better by +10.00 pts (paired bootstrap 95% CI +" in section
    # an evaluation from before the known record: the verdict says why it cannot pair
    (evals / "global_state_attrs-s0.json").write_text(json.dumps(result))
    build_report(cfg)
    section = (tmp_path / "reports" / "table1.md").read_text().split("## Does history help?")[1]
    assert "[GS] + attributes (known targets): cross-entropy better by +0.50: undetermined (n=1" in section


@pytest.mark.parametrize("seeds", [(0, 1, 2), (0,)])
def test_a_row_worse_than_its_yardstick_is_marked_worse_and_a_better_one_better(tmp_path, seeds):
    cfg = write_fake_runs(tmp_path, seeds=seeds, models=("none", "global_state"), with_outfits=True)
    pop = _metrics(5.0, 0.05, 0.15)  # between [None] (5.20-5.30) and [GS] (4.84-4.86): a count [None] loses to
    (tmp_path / "reports" / "eval" / "popularity.json").write_text(
        json.dumps(
            {
                "name": "popularity",
                "model": "popularity",
                "seed": None,
                "parameters": 0,
                "test": pop,
                "val": pop,
                "recall_curve": _curve(0.05, 0.15),
                "test_outfits": fake_outfits(pop),
            }
        )
    )
    result = build_report(cfg)
    assert result["vs_yardstick"] == {
        "none": {"name": "popularity", "verdict": "worse"},
        "global_state": {"name": "popularity", "verdict": "better"},
    }
    table = (tmp_path / "reports" / "table1.md").read_text()
    rows = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| [")}
    assert rows["| [None]"].endswith(
        "| **WORSE** than popularity (+%.2f) |" % (FAKE["none"]["cross_entropy"][0] - 5.0 if len(seeds) == 1 else 0.25)
    )
    assert "| better than popularity (-" in rows["| [GS]"]
    assert "**1 of 2 learned rows are worse than their yardstick: [None].**" in table
    rule = "SE" if len(seeds) > 1 else "paired bootstrap 95% CI"
    assert "- [None]: " in table and f"({rule}" in table.split("## Against the yardsticks")[1]
    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())
    assert metrics["none"]["vs_yardstick"]["verdict"] == -1 and metrics["global_state"]["vs_yardstick"]["verdict"] == 1
