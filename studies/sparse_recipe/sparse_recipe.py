"""Issue 57: the sparse-data recipe (train.init_output: counts, train.rare_id_decay) on planted closets, the default
data and planted hidden tastes. One data project per data kind under --workdir (ingest -> validate -> features
[-> baseline], through the pipeline's CLI: studies/project.py), then one project per run that reads its features,
trains one model (seed 0, one torch thread) and, with --evaluate, evaluates it (its verdict against its yardstick,
the paired bootstrap on the test outfits). Each run's curve, metrics, evaluation and settings go to the results
file (--out, default the study's results.json) as runs/<name>/curve, .../metrics, .../evaluation, .../settings.

    # the closets (studies/closets/settings.yaml), [GS] with history, the sparse recipe
    python studies/sparse_recipe/sparse_recipe.py closets gs_recipe --data --set train.init_output=counts \
        --set train.rare_id_decay=5 --evaluate
    # params.yaml's recipe on the same data
    python studies/sparse_recipe/sparse_recipe.py closets gs_default --evaluate
    # without history (another features folder: --dset)
    python studies/sparse_recipe/sparse_recipe.py closets gs_no_history --dset features.history.enabled=false \
        --data --set train.init_output=counts --set train.rare_id_decay=5 --evaluate
    # the same closets written as H&M's three files and imported by the `hm` source, the defaults only
    python studies/sparse_recipe/sparse_recipe.py closets_hm closets_hm_gs_defaults --data --evaluate

The runs of findings.md are results.json's runs/<name>/* entries (settings: the recipe each ran).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `studies.project`: studies/ is a folder of scripts, not an installed package
from contextual_bert.evaluation import KNOWN_OUTFITS_KEY, OUTFITS_KEY, paired_difference  # noqa: E402
from studies.article_vectors.article_vectors import UNSEEN_YARDSTICK, against_unseen  # noqa: E402
from studies.article_vectors.unseen_mass import measure  # noqa: E402
from studies.closets.closets import settings as closet_settings  # noqa: E402
from studies.project import Project, override, record, relocated  # noqa: E402

DATA_DIRS = ("raw_dir", "validated_dir", "quarantine_dir", "features_dir", "source_fingerprint")
HIDDEN = ["ingest.source=planted", "planted.taste_strength=0.0", "planted.hidden_taste_strength=1.3"]
RECIPE_KEYS = ("init_output", "rare_id_decay", "weight_decay", "bag_warmup_epochs", "bag_warmup_check_steps")
KINDS = {
    "closets": lambda: closet_settings([]),
    "default": lambda: [],
    "planted_hidden": lambda: list(HIDDEN),
    "closets_hm": lambda: closets_hm_settings(),
}
HM_FOLDER = "closets_hm_files"  # under --workdir/data: the closets as H&M's files
# the closets' context columns -> H&M customer columns the `hm` source reads as context (both categorical)
HM_CONTEXT = {"region": "postal_code", "age_group": "club_member_status"}


def closets_hm_settings() -> list[str]:
    """The closets' data settings for the `hm` source: what the H&M files cannot say (the planted story) is
    dropped; the split, history and the one attribute (product type) are the closets'."""
    kept = [a for a in closet_settings([]) if not a.startswith(("ingest.", "planted.", "features.article_attributes."))]
    return [
        *kept,
        "ingest.source=hm",
        "import_hm.basket=day",
        "features.article_attributes.hm={product_type: categorical}",
    ]


def write_closets_as_hm(raw_dir: Path, out: Path) -> dict:
    """The closets' raw tables as H&M's transactions_train.csv, customers.csv and articles.csv: an outfit is one
    customer's basket on one day, so a customer's outfits on the same day are moved to the next free day (counted);
    article ids become H&M's integers. Returns the counts."""
    outfits = pd.read_parquet(raw_dir / "outfits.parquet")
    customers = pd.read_parquet(raw_dir / "customers.parquet")
    articles = pd.read_parquet(raw_dir / "articles.parquet")
    number = {a: 100_000_000 + i for i, a in enumerate(articles["article_id"])}
    outfits = outfits.assign(day=pd.to_datetime(outfits["date"])).sort_values(["customer_id", "day", "outfit_id"])
    days, moved, last = [], 0, {}
    for customer, day in zip(outfits["customer_id"], outfits["day"]):
        free = max(day, last[customer] + pd.Timedelta(days=1)) if customer in last else day
        moved += free != day
        days.append(free)
        last[customer] = free
    outfits["t_dat"] = pd.DatetimeIndex(days).strftime("%Y-%m-%d")
    rows = outfits[["t_dat", "customer_id", "article_ids"]].explode("article_ids")
    out.mkdir(parents=True, exist_ok=True)
    rows.assign(article_id=rows["article_ids"].map(number), price=0.01, sales_channel_id=2)[
        ["t_dat", "customer_id", "article_id", "price", "sales_channel_id"]
    ].to_csv(out / "transactions_train.csv", index=False)
    customers.rename(columns=HM_CONTEXT)[["customer_id", *HM_CONTEXT.values()]].to_csv(
        out / "customers.csv", index=False
    )
    articles.assign(article_id=articles["article_id"].map(number)).rename(
        columns={"product_type": "product_type_name"}
    )[["article_id", "product_type_name"]].to_csv(out / "articles.csv", index=False)
    return {"outfits": len(outfits), "transactions": len(rows), "outfits_moved_a_day_on": int(moved)}


def params_for(data_root: Path, root: Path, assignments: list[str]) -> dict:
    """params.yaml with `assignments`, models / reports / MLflow under `root`, the data folders under `data_root`."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for assignment in assignments:
        override(params, assignment)
    params["train"]["num_threads"] = 1
    mine, data = relocated(params, root), relocated(params, data_root)
    mine["paths"] = {k: data["paths"][k] if k in DATA_DIRS else v for k, v in mine["paths"].items()}
    return mine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("name", help="the run's name (its folder under --workdir/runs, its key in --out)")
    parser.add_argument("--model", default="global_state", help="any model name (train.models)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="the run's params override")
    parser.add_argument("--dset", action="append", default=[], metavar="KEY=VALUE", help="the data's params override")
    parser.add_argument("--data", action="store_true", help="run the data stages first (and the baseline)")
    parser.add_argument("--evaluate", action="store_true")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/sparse_recipe"))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"), help="the results file")
    args = parser.parse_args()

    data_assignments = KINDS[args.kind]() + args.dset
    data_root = args.workdir / "data" / "_".join([args.kind, *(a.replace("=", "-") for a in args.dset)])
    if args.kind == "closets_hm":
        folder = args.workdir / "data" / HM_FOLDER
        data_assignments.append(f"import_hm.source={folder}")
        if args.data:  # the closets' own data project first: its raw tables are what the files say
            closets = args.workdir / "data" / "closets_for_hm"
            Project(closets, params_for(closets, closets, KINDS["closets"]())).stage("ingest")
            record(args.out, f"runs/{args.name}/hm_files", write_closets_as_hm(closets / "data" / "raw", folder))
    if args.data:
        data = Project(data_root, params_for(data_root, data_root, data_assignments))
        for stage in ("ingest", "validate", "features", "baseline"):
            data.stage(stage)
    root = args.workdir / "runs" / args.name
    project = Project(root, params_for(data_root, root, data_assignments + args.set))
    project.stage("train", "--model", args.model, "--seed", "0")
    key = f"runs/{args.name}"
    run = project.path("models_dir") / f"{args.model}-s0"
    for name in ("curve", "metrics"):
        record(args.out, f"{key}/{name}", json.loads((run / f"{name}.json").read_text()))
    if args.evaluate:
        project.stage("evaluate", "--model", args.model, "--seed", "0")
        result = json.loads((project.path("reports_dir") / "eval" / f"{args.model}-s0.json").read_text())
        keep = {k: result[k] for k in ("val", "test", "yardstick") if k in result}
        for part in ("test_known", "test_unseen"):  # a catalogue ranker's targets with and without an id
            if part in result:
                keep[part] = {k: result[part][k] for k in ("n_cases", "cross_entropy", "recall@1", "recall@5")}
        known_count = data_root / "reports" / "eval" / "popularity_history.json"
        if KNOWN_OUTFITS_KEY in result and known_count.exists():  # an "_attrs" model with history, on its known
            count = json.loads(known_count.read_text())  # targets against popularity + own history
            if count.get(OUTFITS_KEY):
                keep["known_against_popularity_history"] = {
                    "model": result["test_known"]["cross_entropy"],
                    "yardstick": count["test"]["cross_entropy"],
                    **paired_difference(result[KNOWN_OUTFITS_KEY], count[OUTFITS_KEY], "cross_entropy"),
                }
        unseen_count = data_root / "reports" / "eval" / f"{UNSEEN_YARDSTICK}.json"
        if "test_unseen" in result and unseen_count.exists():  # the targets without an id against their count
            count = json.loads(unseen_count.read_text())
            keep["unseen_against_popularity_attribute"] = {
                "model": result["test_unseen"]["cross_entropy"],
                "yardstick": count.get("test_unseen", {}).get("cross_entropy"),
                **against_unseen(result, count),
            }
        record(args.out, f"{key}/evaluation", keep)
        if "test_unseen" in result:
            record(args.out, f"{key}/unseen_mass", measure(project.root, args.model))
    recipe = {k: project.params["train"][k] for k in RECIPE_KEYS}
    settings = {
        "data": data_assignments,
        "run": args.set,
        "recipe": recipe,
        "variant": args.model,  # the key the records so far have
        "seconds": project.timings,
    }
    record(args.out, f"{key}/settings", settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
