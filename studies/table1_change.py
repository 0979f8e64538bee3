"""Table 1 before and after a change of recipe: each row's test mean of two `reports/metrics.json` (the seeds'
mean and SE that `contextual-bert report` writes), their difference and the SE of the difference, as
Table 1 compares two rows (report.compare). A row "loses" when it is worse by more than that SE, "gains" when better
by more. `--before` may name a git revision (`REV:path`), so the committed Table 1 is the baseline.

    python studies/table1_change.py --before HEAD:reports/metrics.json --after reports/metrics.json \
        --out reports/experiments/encoder_recipe/default_table1_change.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from contextual_bert.report import LABELS, compare

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
            verdict = ("gains" if gain["beats_by_more_than_se"] else "loses" if loss["beats_by_more_than_se"]
                       else "within SE")
            row[metric] = {"before": b["mean"], "after": a["mean"], "better_by": gain["improvement"],
                           "se_of_difference": gain["se"], "verdict": verdict}
        rows[model] = row
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = change(load(args.before), load(args.after))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"before": args.before, "after": args.after, "rows": rows}, indent=1))
    print("| Model | CE before | after | better by (SE) | recall@1 % before | after | better by, pts (SE) |")
    print("|---|---|---|---|---|---|---|")
    for model, row in rows.items():
        ce, r1 = row.get("cross_entropy"), row.get("recall@1")
        if ce is None:
            continue
        r1_text = ("| – | – | – |" if r1 is None else
                   f"| {100 * r1['before']:.2f} | {100 * r1['after']:.2f} | "
                   f"{100 * r1['better_by']:+.2f} ({100 * r1['se_of_difference']:.2f}) |")
        print(f"| {LABELS.get(model, model)} | {ce['before']:.3f} | {ce['after']:.3f} | "
              f"{ce['better_by']:+.3f} ({ce['se_of_difference']:.3f}) {r1_text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
