"""The closets Table 1 (issue 56, item 5): planted closets (data/planted/closets.py) at about real personalised outfits'
shape, 30k outfits of 80k articles, each customer re-wearing a hidden closet; time split, history on, one seed, ids
only: the four context variants and the bag of items + c, every yardstick (baseline: popularity, popularity by
attribute, popularity + own history) and the exact optimum (without context, with context, with context and
history). Today's recipe, as it is: the starting point of the research issue.

A project of its own under --workdir (studies/project.py): the repository's params.yaml, then settings.yaml's
keys, then each --set. Without --train only the data stages, the baseline and the optimum run (minutes), and
the results file (--out, default the study's results.json) gets `yardsticks` (with the data's ingest report; its
table printed); with --train the trainings, their evaluations (each row's verdict against its yardstick) and the
report too, and the results file gets `table1` (one string a line), `metrics` and `seconds`. --written runs no data stage: it reads what an earlier call with the same settings wrote in --workdir
(with --train: trains on that data).

    # the data, the yardsticks and the optimum (minutes)
    python studies/closets/closets.py --workdir /tmp/closets
    # + the Table 1, on the data the call above wrote
    python studies/closets/closets.py --workdir /tmp/closets --train --written
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import Project, override, record, relocated  # noqa: E402

DATA_STAGES = ("ingest", "validate", "features", "baseline", "optimum")
YARDSTICKS = ("popularity", "popularity_attribute", "popularity_history", "optimum_no_context", "optimum_context",
              "optimum_history")  # fmt: skip
METRICS = ("cross_entropy", "recall@1", "recall@5", "recall@10", "recall@250", "mrr")


def settings(extra: list[str], path: Path = HERE / "settings.yaml") -> list[str]:
    """settings.yaml's keys as --set assignments, then `extra`'s."""
    return [f"{key}={json.dumps(value)}" for key, value in yaml.safe_load(path.read_text()).items()] + extra


def yardsticks(project: Project) -> dict:
    """Per yardstick and optimum row: its test and validation metrics (or why it is unknown)."""
    out = {}
    for name in YARDSTICKS:
        result = json.loads((project.path("reports_dir") / "eval" / f"{name}.json").read_text())
        if result.get("known") is False:
            out[name] = {"known": False, "why": result["why"]}
            continue
        # a row that ranks the catalogue (the attribute-aware popularity): on the targets the vocabulary knows, the
        # other rows' cases (all its targets apart, under test_all)
        part = "test_known" if result.get("ranked") == "catalogue" else "test"
        pick = lambda metrics: {m: metrics[m] for m in ("n_outfits", "n_cases", *METRICS) if m in metrics}  # noqa: E731
        out[name] = {"test": pick(result[part]), "val": pick(result["val"])}
        if part != "test":
            out[name]["test_all"] = pick(result["test"])
        out[name]["test_ci"] = {
            m: result[f"{part}_bootstrap"][m]
            for m in ("cross_entropy", "recall@5")
            if m in result.get(f"{part}_bootstrap", {})
        }
        for key in ("weight", "attribute", "n_history_outfits"):
            if key in result:
                out[name][key] = result[key]
    return out


def write_yardsticks(project: Project, out: Path, assignments: list[str]) -> dict:
    raw = project.path("raw_dir")
    manifest = json.loads((project.path("features_dir") / "manifest.json").read_text())
    result = {"set": assignments, "ingest": json.loads((raw / "ingest_report.json").read_text()),
              "features": {k: manifest[k] for k in ("rows", "split", "unknown_items") if k in manifest},
              "rows": yardsticks(project), "seconds": project.timings}  # fmt: skip
    record(out, "yardsticks", result)
    lines = [
        "# Planted closets: the yardsticks and the exact optimum (test split)",
        "",
        f"Settings: {', '.join(assignments)}.",
        "",
        "Every row on the same test cases: the targets in the training vocabulary (the attribute-aware popularity "
        "ranks the whole catalogue; its numbers on all targets are in results.json's yardsticks, test_all).",
        "",
        "| Row | Test cases | Cross-entropy [95% CI] | Recall@1 % | Recall@5 % | Recall@10 % | Recall@250 % | MRR |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in result["rows"].items():
        if row.get("known") is False:
            lines.append(f"| {name} | unknown: {row['why']} | | | | | | |")
            continue
        t, ci = row["test"], row["test_ci"].get("cross_entropy")
        ce = f"{t['cross_entropy']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
        lines.append(
            f"| {name} | {t['n_cases']:,} | {ce} | {100 * t['recall@1']:.2f} | {100 * t['recall@5']:.2f} | "
            f"{100 * t['recall@10']:.2f} | {100 * t['recall@250']:.2f} | {t['mrr']:.4f} |"
        )
    print("\n".join(lines))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a params override")
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=HERE / "results.json", help="the results file")
    parser.add_argument(
        "--train",
        action="store_true",
        help="also train and evaluate train.models x train.seeds and write the report (hours of CPU)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="trainings at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per training")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the models an earlier call with the same settings trained in --workdir (evaluated again)",
    )
    parser.add_argument(
        "--written",
        action="store_true",
        help="run no data stage: read what an earlier call with the same settings wrote in --workdir",
    )
    args = parser.parse_args()

    assignments = settings(args.set)
    params = yaml.safe_load(args.params.read_text())
    for assignment in assignments:
        override(params, assignment)
    params["train"]["num_threads"] = args.threads
    project = Project(args.workdir, relocated(params, args.workdir), args.threads)
    if args.reuse or args.written:
        project.check_reusable()
    if args.written:
        before = json.loads(args.out.read_text()).get("yardsticks", {}) if args.out.exists() else {}
        project.timings = before.get("seconds", {})
    for stage in () if args.written else DATA_STAGES:
        project.stage(stage)
    write_yardsticks(project, args.out, assignments)
    if args.train:
        runs = [(v, s) for v in params["train"]["models"] for s in params["train"]["seeds"]]
        project.train_and_evaluate(runs, args.jobs, args.reuse)
        project.stage("report")
        reports = project.path("reports_dir")
        record(args.out, "table1", (reports / "table1.md").read_text().splitlines())
        record(args.out, "metrics", json.loads((reports / "metrics.json").read_text()))
        record(args.out, "seconds", project.timings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
