"""How much of a customer's own record the history feature used to throw away (issue 57): the popularity + own
history count as the history feature let it count, against the same count over every earlier outfit with how often
the customer wore each article.

The yardstick of the models with history (evaluation.counts.HistoryPopularityModel) mixes popularity with the
customer's share of each article in the history feature: (1 - w) P_pop(a) + w P_hist(a). The rows here differ in
the history they count, all under the one history rule (data/history.earlier_outfits: the same customer's strictly
earlier outfits; known articles only):

- `recent_once_50`: the history feature as it was, the most recent earlier outfits' articles, each once, at most 50;
  P_hist uniform over them;
- `every n^g`: every earlier outfit, P_hist(a) = n(a)^g / sum_b n(b)^g, n(a) how many of them hold a; g = 0 (each
  article once, no cut-off), 1 (by count), 2 (the re-worn lifted further);
- `by_count_K`: the history feature's rule now (data/history.history_items): an article once per earlier outfit that
  held it, the most worn first, in K slots; P_hist by slots (n^1);
- `features`: the features folder's own history column, counted by slots as the yardstick counts it (with the
  current code: by_count_<features.history.max_items>).

Each row's weight is chosen on validation from the yardstick's grid (evaluation.counts.HISTORY_WEIGHTS), then scored
on test; the cases are ranking.case_ranks's (every known target). Gains are against `recent_once_50`, paired on the
test outfits.

Each data kind's data stages run in a project of its own under --workdir (studies/project.py; time split, history
on): the kinds of studies/sparse_recipe, closets (studies/closets/settings.yaml), planted_hidden (the planted
hidden tastes) and default (the synthetic generator's default data). Or --data reads any project's data
folder (its features/ and validated/), e.g. a whole run's H&M-format set:

    python studies/history_counts/history_counts.py --kind closets --workdir /tmp/history_counts
    python studies/history_counts/history_counts.py --data /tmp/whole_run/global_state_attrs_100000/data \
        --name hm_generated_100000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from contextual_bert.data import N_SPECIAL, earlier_outfits, history_items
from contextual_bert.evaluation import HISTORY_WEIGHTS, bootstrap_ci

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))  # studies.project, studies.sparse_recipe
from studies.project import record  # noqa: E402
from studies.sparse_recipe.sparse_recipe import KINDS  # noqa: E402  (the data kinds' settings, one place)

HISTORY_ON = ["features.split=time", "features.history.enabled=true"]
SLOTS = (50, 100, 200)  # history slots of the rows that keep an article once per outfit that held it


def kind_settings(kind: str) -> list[str]:
    """The --set assignments of a data kind (sparse_recipe.KINDS), history on and the time split."""
    return [*KINDS[kind](), *HISTORY_ON]


def make_data(kind: str, workdir: Path) -> Path:
    """Run the kind's ingest, validate and features in a project of its own; its data folder."""
    from studies.project import Project, override, relocated

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for assignment in kind_settings(kind):
        override(params, assignment)
    root = workdir / kind
    project = Project(root, relocated(params, root))
    for stage in ("ingest", "validate", "features"):
        project.stage(stage)
    return project.path("features_dir").parent


def cases(outfits: pd.DataFrame, split: str, n_ids: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, target) of every known target (an article with an id, below n_ids) of the split's outfits, in
    outfit order."""
    rows, targets = [], []
    for row in np.flatnonzero(outfits["split"].to_numpy() == split):
        for item in outfits["items"].iat[row]:
            if N_SPECIAL <= item < n_ids:
                rows.append(row)
                targets.append(int(item))
    return np.array(rows), np.array(targets)


def history_probs(record: dict, target: int, power: float) -> float:
    """P_hist(target) for one case's record {article: n}; 0 for an empty record."""
    if not record:
        return 0.0
    weights = np.array(list(record.values()), dtype=np.float64) ** power
    return float(record.get(target, 0) ** power / weights.sum()) if target in record else 0.0


def row_log_probs(pop: np.ndarray, hist: np.ndarray, has: np.ndarray) -> np.ndarray:
    """(cases, weights) log of (1 - w) P_pop + w P_hist, w = 0 for a case without a record."""
    w = np.array(HISTORY_WEIGHTS)[None, :] * has[:, None]
    return np.log((1 - w) * pop[:, None] + w * hist[:, None])


def data_arguments(parser: argparse.ArgumentParser) -> None:
    """The data a study of this folder reads: --kind (its data stages run under --workdir), or --data and --name."""
    parser.add_argument("--kind", choices=sorted(KINDS))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/history_counts"))
    parser.add_argument("--data", type=Path, help="instead of --kind: a project's data folder (features/, validated/)")
    parser.add_argument("--name", help="the data's name with --data")


def parse_data(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The arguments, args.data the data folder (a --kind's made first) and args.name its name."""
    args = parser.parse_args()
    if (args.kind is None) == (args.data is None) or (args.data is not None and not args.name):
        parser.error("either --kind, or --data with --name")
    if args.kind:
        args.name, args.data = args.kind, make_data(args.kind, args.workdir)
    return args


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data_arguments(parser)
    parser.add_argument(
        "--out", type=Path, default=HERE / "results.json", help="the results file; the entry's key: the kind or --name"
    )
    args = parse_data(parser)

    outfits = pd.read_parquet(args.data / "features" / "outfits.parquet")
    dates = pd.read_parquet(args.data / "validated" / "outfits.parquet", columns=["outfit_id", "date"])
    outfits = outfits.merge(dates, on="outfit_id", how="left", validate="one_to_one")
    split_rule = json.loads((args.data / "features" / "manifest.json").read_text())["params"]["split"]
    if split_rule != "time":
        sys.exit(f"{args.data}: features.split is {split_rule}; this study reads the time split's histories")
    counts = pd.read_parquet(args.data / "features" / "article_vocab.parquet").sort_values("index")["count"]
    probs = counts.to_numpy(np.float64) + 1.0
    probs[:N_SPECIAL] = 0.0
    probs /= probs.sum()
    earlier = earlier_outfits(outfits["customer_id"].tolist(), outfits["date"].tolist())
    items = outfits["items"].tolist()
    n_ids = len(probs)  # the features' items are catalogue indices: those below n_ids have an id (known)

    def records(row: int) -> dict[str, dict]:
        """The case's history, article -> n, as each row counts it."""
        every: dict[int, int] = {}
        recent: dict[int, int] = {}
        for r in earlier[row]:  # most recent first
            for a in dict.fromkeys(int(x) for x in items[r]):
                if a >= N_SPECIAL and len(recent) < 50:
                    recent.setdefault(a, 1)  # as the feature was: [UNK] took slots too
                if N_SPECIAL <= a < n_ids:
                    every[a] = every.get(a, 0) + 1
        out = {
            "recent_once_50": {a: 1 for a in recent if a < n_ids},
            "every": every,
            "features": slot_counts(outfits["history"].iat[row]),
        }
        for slots in SLOTS:
            out[f"by_count_{slots}"] = slot_counts(history_items([earlier[row]], items, slots)[0])
        return out

    def slot_counts(slots) -> dict[int, int]:
        counted: dict[int, int] = {}
        for a in slots:
            if N_SPECIAL <= int(a) < n_ids:
                counted[int(a)] = counted.get(int(a), 0) + 1
        return counted

    rows_of = {}
    for split in ("val", "test"):
        rows, targets = cases(outfits, split, n_ids)
        recs = {row: records(row) for row in np.unique(rows)}
        pop = probs[targets]
        table = {}
        rows_kinds = [
            ("recent_once_50", 0.0),
            ("every", 0.0),
            ("every", 1.0),
            ("every", 2.0),
            *((f"by_count_{s}", 1.0) for s in SLOTS),
            ("features", 1.0),
        ]
        for kind, power in rows_kinds:
            hist = np.array([history_probs(recs[r][kind], t, power) for r, t in zip(rows, targets)])
            has = np.array([bool(recs[r][kind]) for r in rows], dtype=np.float64)
            table[f"{kind} n^{power:g}"] = row_log_probs(pop, hist, has)
        rows_of[split] = (rows, targets, table, pop)

    result = {"data": args.name, "folder": str(args.data), "weights": list(HISTORY_WEIGHTS), "rows": {}}
    val_rows, _, val_table, _ = rows_of["val"]
    test_rows, test_targets, test_table, test_pop = rows_of["test"]
    result["n_cases"] = {"val": len(val_rows), "test": len(test_rows)}
    reference = None
    outfit = np.unique(test_rows, return_inverse=True)[1]  # 0..n-1, as bootstrap_ci counts outfits
    n_outfits = int(outfit.max()) + 1
    for name in val_table:
        by_weight = -val_table[name].mean(axis=0)
        pick = int(np.argmin(by_weight))
        log_prob = test_table[name][:, pick]
        if reference is None:
            reference = log_prob  # recent_once_50: the history feature as it was
        ci = bootstrap_ci(outfit, {"cross_entropy": -log_prob}, n_outfits=n_outfits)
        diff = bootstrap_ci(outfit, {"cross_entropy": reference - log_prob}, n_outfits=n_outfits)
        result["rows"][name] = {
            "weight": HISTORY_WEIGHTS[pick],
            "val_cross_entropy": float(by_weight[pick]),
            "test_cross_entropy": float(-log_prob.mean()),
            "test_ci": ci["cross_entropy"],
            "gain_over_recent_once_50": float((log_prob - reference).mean()),
            "gain_ci": [-x for x in diff["cross_entropy"]][::-1],
        }
    result["rows"]["popularity"] = {"test_cross_entropy": float(-np.log(test_pop).mean())}
    record(args.out, args.name, result)
    print(json.dumps(result["rows"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
