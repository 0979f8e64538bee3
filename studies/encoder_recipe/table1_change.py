"""Table 1 before and after a change of recipe: each row's test mean of two `reports/metrics.json` (the seeds'
mean and SE that `contextual-bert report` writes), their difference and the SE of the difference, as
Table 1 compares two rows (report_stats.compare). A row "loses" when it is worse by more than that SE, "gains" when better
by more. `--before` may name a git revision (`REV:path`), so the committed Table 1 is the baseline.

`--runs-before REV` also pairs every run's best validation cross-entropy (`reports/train/<run>.json`) with the
same run (model and seed) at that revision: per model, the mean of the seeds' differences and its SE over the
seeds, the comparison that the shared seeds allow (the test rows above are unpaired).

    python studies/encoder_recipe/table1_change.py --before HEAD:reports/metrics.json --after reports/metrics.json \
        --run default_table1_change
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from contextual_bert.evaluation import LABELS, compare

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # `studies.project`: studies/ is a folder of scripts, not an installed package
from studies.project import record  # noqa: E402

METRICS = (("cross_entropy", False), ("recall@1", True), ("recall@5", True), ("outfit_dependence", True))


def load(spec: str) -> dict:
    if ":" in spec and not Path(spec).exists():
        return json.loads(subprocess.run(["git", "show", spec], capture_output=True, text=True, check=True).stdout)
    return json.loads(Path(spec).read_text())


def change(before: dict, after: dict) -> dict:
    rows = {}
    for model, result in after.items():
        if model not in before or "test" not in result:
            continue
        row = {}
        for metric, higher_better in METRICS:
            b, a = before[model]["test"].get(metric), result["test"].get(metric)
            if not isinstance(b, dict) or not isinstance(a, dict):
                continue
            gain, loss = compare(a, b, higher_better), compare(b, a, higher_better)
            verdict = (
                "gains" if gain["beats_by_more_than_se"] else "loses" if loss["beats_by_more_than_se"] else "within SE"
            )
            row[metric] = {
                "before": b["mean"],
                "after": a["mean"],
                "better_by": gain["improvement"],
                "se_of_difference": gain["se"],
                "verdict": verdict,
            }
        rows[model] = row
    return rows


def paired_runs(revision: str, train_dir: Path = Path("reports/train")) -> dict:
    """Per model: each seed's best validation CE now and at `revision`, the mean difference (positive: now
    better) and its SE over the seeds."""
    models: dict[str, dict] = {}
    for path in sorted(train_dir.glob("*-s*.json")):
        try:
            before = load(f"{revision}:{path}")
        except subprocess.CalledProcessError:
            continue
        model, seed = path.stem.rsplit("-s", 1)
        after = json.loads(path.read_text())
        models.setdefault(model, {})[seed] = (before["best_val_cross_entropy"], after["best_val_cross_entropy"])
    out = {}
    for model, seeds in models.items():
        gains = [b - a for b, a in seeds.values()]
        out[model] = {
            "seeds": {s: {"before": b, "after": a} for s, (b, a) in seeds.items()},
            "better_by": statistics.mean(gains),
            "se": statistics.stdev(gains) / len(gains) ** 0.5 if len(gains) > 1 else None,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--runs-before", metavar="REV", help="pair the runs' validation CE with this revision's")
    parser.add_argument("--run", required=True, help="the run's key in the results file")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).with_name("results.json"),
        help="the results file (default: the study's results.json)",
    )
    args = parser.parse_args()
    rows = change(load(args.before), load(args.after))
    report = {"before": args.before, "after": args.after, "rows": rows}
    if args.runs_before:
        report["validation_paired_by_seed"] = paired_runs(args.runs_before)
    record(args.out, args.run, report)
    print("| Model | CE before | after | better by (SE) | recall@1 % before | after | better by, pts (SE) |")
    print("|---|---|---|---|---|---|---|")
    for model, row in rows.items():
        ce, r1 = row.get("cross_entropy"), row.get("recall@1")
        if ce is None:
            continue
        r1_text = (
            "| – | – | – |"
            if r1 is None
            else f"| {100 * r1['before']:.2f} | {100 * r1['after']:.2f} | "
            f"{100 * r1['better_by']:+.2f} ({100 * r1['se_of_difference']:.2f}) |"
        )
        print(
            f"| {LABELS.get(model, model)} | {ce['before']:.3f} | {ce['after']:.3f} | "
            f"{ce['better_by']:+.3f} ({ce['se_of_difference']:.3f}) {r1_text}"
        )
    for model, paired in report.get("validation_paired_by_seed", {}).items():
        se = "–" if paired["se"] is None else f"{paired['se']:.4f}"
        print(f"validation, paired by seed: {LABELS.get(model, model)} better by {paired['better_by']:+.4f} (SE {se})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
