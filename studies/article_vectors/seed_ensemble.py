"""How far one recipe's test score moves with the training seed, and what its seeds score together (issue 71): per
trained model (a study project and its seed) the test cross-entropy as trained and mixed with its count
(count_mixture.py: the weight fitted on validation), their mean and standard error over the seeds, and the
ensemble: P(a | O) the mean of the seeds' P_model(a | O), as trained and mixed with the count (its own weight on
validation). Each figure beside its share of the gap between the count (the attribute-aware popularity) and the
optimum without context (the project's evaluate.optimum_no_context), and the ensemble against the count and against
the first model (paired bootstrap over the test outfits). The projects must share their data: the same cases, the
same count.

Why: the issue's half of the gap is 0.004 nats from the best single model; whether that is within a seed's reach
is read against the seeds' spread, and an ensemble says what averaging the estimation noise of 20,000 outfits buys.

    python studies/article_vectors/seed_ensemble.py --model none_attrs \\
        --runs /tmp/av/vectors_48_ids07:0,/tmp/av/vectors_48_ids07_s1:1,/tmp/av/vectors_48_ids07_s2:2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `studies.`: a folder of scripts, not a package
from contextual_bert.evaluation import outfit_record, paired_difference  # noqa: E402
from studies.article_vectors.count_mixture import cases_of, mixed, mixture_weight  # noqa: E402
from studies.article_vectors.unseen_mass import load_trained  # noqa: E402

GAP_ENDS = ("popularity_attribute", "optimum_no_context")  # the count and the optimum, evaluate's reports


def mean_of(log_probs: list[np.ndarray]) -> np.ndarray:
    """log of the mean of the probabilities."""
    return np.logaddexp.reduce(np.stack(log_probs), axis=0) - np.log(len(log_probs))


def gap_ends(project: Path) -> tuple[float, float]:
    params = yaml.safe_load((project / "params.yaml").read_text())
    evals = Path(params["paths"]["reports_dir"]) / "eval"
    count, optimum = (json.loads((evals / f"{y}.json").read_text())["test"]["cross_entropy"] for y in GAP_ENDS)
    return count, optimum


def share(ce: float, ends: tuple[float, float]) -> float:
    """How much of the gap between the count and the optimum (`ends`, gap_ends') a cross-entropy closes."""
    count_ce, optimum_ce = ends
    return (count_ce - ce) / (count_ce - optimum_ce)


def scores(val: np.ndarray, test: np.ndarray, count: dict, ends: tuple[float, float]) -> dict:
    """A model's test cross-entropy from its cases' log-probabilities, as trained and mixed with the count (`count`:
    split -> the count's log-probabilities; the weight fitted on validation), each beside its share of the gap."""
    w = mixture_weight(val, count["val"])
    trained, with_count = float(-test.mean()), float(-mixed(test, count["test"], w).mean())
    return {"test": trained, "share": share(trained, ends), "weight": w,
            "mixed": with_count, "mixed_share": share(with_count, ends)}  # fmt: skip


def gap_record(ends: tuple[float, float]) -> dict:
    count_ce, optimum_ce = ends
    return {"count": count_ce, "optimum_no_context": optimum_ce, "half": (count_ce + optimum_ce) / 2}


def measure(runs: list[tuple[Path, int]], model_name: str) -> dict:
    scored = []
    for project, seed in runs:
        t = load_trained(project, model_name, seed)
        n_outfits = len(t.test.items)
        scored.append({split: (cases_of(t.model, data), cases_of(t.count, data))
                       for split, data in (("val", t.val), ("test", t.test))})  # fmt: skip
    first = scored[0]
    for s in scored:  # the same cases in the same order, the same count
        for split in ("val", "test"):
            assert np.array_equal(s[split][0]["target"], first[split][0]["target"])
            assert np.allclose(s[split][1]["log_prob"], first[split][1]["log_prob"])
    count = {split: first[split][1]["log_prob"] for split in ("val", "test")}
    ends = gap_ends(runs[0][0])
    each = [scores(s["val"][0]["log_prob"], s["test"][0]["log_prob"], count, ends) for s in scored]
    ensemble_val = mean_of([s["val"][0]["log_prob"] for s in scored])
    ensemble_test = mean_of([s["test"][0]["log_prob"] for s in scored])
    ensemble = scores(ensemble_val, ensemble_test, count, ends)
    outfit, ids = first["test"][0]["outfit"], list(range(n_outfits))

    def record(log_prob: np.ndarray) -> dict:
        return outfit_record(outfit, {"cross_entropy": -log_prob}, ids)

    mixed_ensemble = mixed(ensemble_test, count["test"], ensemble["weight"])
    paired = {}
    for name, other in (("count", count["test"]), ("the first model", first["test"][0]["log_prob"])):
        for label, mine in (("ensemble", ensemble_test), ("ensemble mixed", mixed_ensemble)):
            diff = paired_difference(record(mine), record(other), "cross_entropy")
            paired[f"{label} - {name}"] = {"difference": diff["difference"], "interval": diff["interval"]}

    def spread(key: str) -> dict:
        values = np.array([e[key] for e in each])
        se = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else None
        return {"mean": float(values.mean()), "se": se, "mean_share": share(float(values.mean()), ends)}

    return {
        "runs": [{"project": str(p), "seed": s, **e} for (p, s), e in zip(runs, each)],
        "seeds": {"test": spread("test"), "mixed": spread("mixed")},
        "ensemble": ensemble,
        "paired": paired,
        "gap": gap_record(ends),
        "cases": {"test": int(len(outfit))},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--runs", required=True, help="comma-separated project:seed")
    args = parser.parse_args()
    runs = [(Path(p), int(s)) for p, s in (r.rsplit(":", 1) for r in args.runs.split(","))]
    print(json.dumps(measure(runs, args.model), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
