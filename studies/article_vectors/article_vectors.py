"""Article vectors (issue 71): on planted data, does a vector per article that carries what no column shows let a
model rank articles, above all those never seen in training, better than the attribute-aware popularity, and does
the gain vanish when the vectors carry nothing? On the H&M sample, do vectors derived from the product text rank
better than the text as attributes, or no text? The cells and their bases are declared in `settings.yaml`.

Each cell is a project of its own under --work (studies/project.py): ingest, validate, features, baseline,
optimum, then each model's train and evaluate, through the CLI. Results go to this folder's results.json:
`<cell>/<model>` (test cross-entropy on all, known and unseen targets, the verdict against its yardstick),
`<cell>/<model>/unseen_mass` (unseen_mass.py: the mass on the articles without an id, with and without the offset),
`<cell>/<model>/against_yardstick_unseen` (the paired difference on the targets without an id, model minus the
attribute-aware popularity),
`<cell>/yardsticks`, `<cell>/settings`.

    python studies/article_vectors/article_vectors.py --work /tmp/article_vectors [--cells vectors,...]
    python studies/article_vectors/article_vectors.py --work /tmp/article_vectors --compare   # settings' comparisons
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from contextual_bert.evaluation import KNOWN_OUTFITS_KEY, OUTFITS_KEY, paired_difference  # noqa: E402
from studies.article_vectors.unseen_mass import measure  # noqa: E402
from studies.project import Project, override, record, relocated  # noqa: E402

HERE = Path(__file__).resolve().parent
PARTS = ("test", "test_known", "test_unseen")
YARDSTICKS = ("popularity_attribute", "optimum_no_context", "popularity")
UNSEEN_YARDSTICK = YARDSTICKS[0]  # the count that ranks an article without an id: its attributes' popularity


def parts(result: dict) -> dict:
    return {part: result[part]["cross_entropy"] for part in PARTS if part in result}


def unseen_record(result: dict) -> dict | None:
    """The per-outfit record of the targets without an id: the record of all targets less that of the known ones,
    outfit by outfit (both records are sums over an outfit's cases, so they subtract)."""
    every, known = result.get(OUTFITS_KEY), result.get(KNOWN_OUTFITS_KEY)
    if every is None or known is None:
        return None
    position = {o: i for i, o in enumerate(known["outfit_id"])}
    take = [position.get(o) for o in every["outfit_id"]]

    def less(values: list, known_values: list) -> list:
        return [v - (0 if i is None else known_values[i]) for v, i in zip(values, take)]

    return {
        "outfit_id": every["outfit_id"],
        "cases": less(every["cases"], known["cases"]),
        "sums": {m: less(v, known["sums"][m]) for m, v in every["sums"].items() if m in known["sums"]},
    }


def against_unseen(result: dict, yardstick: dict) -> dict:
    """The paired difference of the test cross-entropy on the targets without an id, model minus yardstick."""
    a, b = unseen_record(result), unseen_record(yardstick)
    if a is None or b is None:
        return {"difference": None, "interval": None, "why": "no per-outfit record of the known targets"}
    return paired_difference(a, b, "cross_entropy")


def compare(settings: dict, work: Path, out: Path) -> None:
    """Each of settings' comparisons, per model the two cells share: `<a>-vs-<b>/<model>`, the paired difference
    of the test cross-entropy (a minus b) on all targets, on those with an id and on those without."""
    for a, b in settings["comparisons"]:
        models = set(settings["models"][settings["cells"][a]["base"]]) & set(
            settings["models"][settings["cells"][b]["base"]]
        )
        for model in sorted(models):
            runs = [json.loads((work / cell / "reports" / "eval" / f"{model}-s{settings['seed']}.json").read_text())
                    for cell in (a, b)]  # fmt: skip
            record(out, f"{a}-vs-{b}/{model}", {
                part: paired_difference(runs[0][key], runs[1][key], "cross_entropy")
                for part, key in (("all", OUTFITS_KEY), ("known", KNOWN_OUTFITS_KEY))
            } | {"unseen": against_unseen(*runs)})  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--cells", help="comma-separated cells (default: every cell, in the declared order)")
    parser.add_argument("--out", type=Path, default=HERE / "results.json", help="the results file")
    parser.add_argument("--compare", action="store_true", help="only the paired differences of settings' comparisons")
    args = parser.parse_args()

    settings = yaml.safe_load((HERE / "settings.yaml").read_text())
    if args.compare:
        compare(settings, args.work, args.out)
        return 0
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    record(args.out, "settings", {"commit": commit.strip(), "settings": settings})
    for name in args.cells.split(",") if args.cells else settings["cells"]:
        cell = settings["cells"][name]
        seed = cell.get("seed", settings["seed"])  # a cell may name its own training seed
        assignments, models = settings["bases"][cell["base"]] + cell["set"], settings["models"][cell["base"]]
        params = yaml.safe_load((REPO / "params.yaml").read_text())
        for assignment in assignments:
            override(params, assignment)
        params["train"] |= {"num_threads": 1, "models": models, "seeds": [seed]}
        project = Project(args.work / name, relocated(params, args.work / name))
        for stage in ("ingest", "validate", "features", "baseline", "optimum"):
            project.stage(stage)
        evals = project.path("reports_dir") / "eval"
        record(
            args.out,
            f"{name}/yardsticks",
            {
                y: parts(json.loads((evals / f"{y}.json").read_text()))
                for y in YARDSTICKS
                if (evals / f"{y}.json").exists()
            },
        )
        for model in models:
            project.stage("train", "--model", model, "--seed", str(seed))
            project.stage("evaluate", "--model", model, "--seed", str(seed))
            result = json.loads((evals / f"{model}-s{seed}.json").read_text())
            trained = json.loads((project.path("models_dir") / f"{model}-s{seed}" / "metrics.json").read_text())
            record(args.out, f"{name}/{model}", {
                **parts(result), "yardstick": result.get("yardstick"), "outfit_dependence": result["test"].get("outfit_dependence"),
                "epochs": trained["epochs"], "best_epoch": trained["best_epoch"], "converged": trained["converged"],
                "best_val_cross_entropy": trained.get("best_val_cross_entropy"),
                "id_dropout": trained.get("id_dropout"),
            })  # fmt: skip
            yardstick = evals / f"{UNSEEN_YARDSTICK}.json"
            if yardstick.exists():
                record(args.out, f"{name}/{model}/against_yardstick_unseen",
                       against_unseen(result, json.loads(yardstick.read_text())))  # fmt: skip
            record(args.out, f"{name}/{model}/unseen_mass", measure(project.root, model, seed))
        record(args.out, f"{name}/settings", {"commit": commit.strip(), "set": assignments, "seconds": project.timings})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
