"""`contextual-bert <stage>`: one subcommand per pipeline stage, each a thin call into the library.

Every handler reads params.yaml (``--params``) through `load_config`, so a bad config fails before any work.
User-facing errors (`ContextualBertError`) print as one line and exit 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from contextual_bert.config import MODELS, Config, load_config
from contextual_bert.errors import ContextualBertError


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def _without_curve(report: dict) -> dict:
    """An evaluation as printed: its metrics; the 250-point recall curve stays in the file."""
    return {k: v for k, v in report.items() if k != "recall_curve"}


# --- stage handlers: each owns its arguments and calls exactly one library entry point ---------------


def _cmd_ingest(cfg: Config, args) -> None:
    from contextual_bert.data.sources import ingest

    source = getattr(args, "source", None)
    _print_json(ingest(cfg, Path(source) if source else None, name=args.source_name))


def _cmd_source(cfg: Config, args) -> None:
    from contextual_bert.data.sources import write_fingerprint

    _print_json(write_fingerprint(cfg))


def _cmd_validate(cfg: Config, args) -> None:
    from contextual_bert.data.validation import validate

    _print_json(
        validate(
            raw_dir=cfg.paths.raw_dir,
            validated_dir=cfg.paths.validated_dir,
            quarantine_dir=cfg.paths.quarantine_dir,
            report_dir=cfg.paths.reports_dir / "validation",
            cfg=cfg.validate_,
            max_set_size=cfg.model.max_set_size,
            min_set_size=cfg.ingest.min_set_size,
        )
    )


def _cmd_features(cfg: Config, args) -> None:
    from contextual_bert.data.features import build_features

    manifest = build_features(
        cfg.paths.validated_dir, cfg.paths.features_dir, cfg.features, max_set_size=cfg.model.max_set_size
    )
    _print_json({k: v for k, v in manifest.items() if k != "spec"})


def _cmd_train(cfg: Config, args) -> None:
    from contextual_bert import cpu_kernels

    cpu_kernels.pin(cfg.train_for(args.model).cpu_kernels)  # before torch is imported: the libraries read it once
    from contextual_bert.registry.tracking import track_training
    from contextual_bert.training import train

    # Every training is an MLflow run (tracking.py): per-epoch metrics as it goes, the rest at the end.
    out_dir = cfg.run_dir(args.model, args.seed)
    with track_training(cfg, args.model, args.seed, out_dir, params_file=Path(args.params)) as tracker:
        result = train(
            features_dir=cfg.paths.features_dir,
            out_dir=out_dir,
            model_name=args.model,
            seed=args.seed,
            model_cfg=cfg.model_for(args.model),
            train_cfg=cfg.train_for(args.model),
            on_epoch_end=tracker.log_epoch,
        )
        tracker.log_result(result)
    metrics_path = cfg.train_metrics_path(args.model, args.seed)
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    metrics_path.write_text(json.dumps(result, indent=2))
    _print_json(result)


def _cmd_evaluate(cfg: Config, args) -> None:
    from contextual_bert.evaluation.evaluate import evaluate_run
    from contextual_bert.registry.tracking import log_evaluation

    report = evaluate_run(
        features_dir=cfg.paths.features_dir,
        run_dir=cfg.run_dir(args.model, args.seed),
        out_path=cfg.eval_path(f"{args.model}-s{args.seed}"),
        cfg=cfg.evaluate,
    )
    # The metrics also go to the training's MLflow run (found through models/<run>/mlflow_run.json).
    log_evaluation(cfg, cfg.run_dir(args.model, args.seed), report, cfg.eval_path(f"{args.model}-s{args.seed}"))
    _print_json(_without_curve(report))


def _cmd_baseline(cfg: Config, args) -> None:
    from contextual_bert.evaluation.evaluate import (
        evaluate_attribute_history_popularity,
        evaluate_attribute_popularity,
        evaluate_history_popularity,
        evaluate_popularity,
    )

    report = evaluate_popularity(
        features_dir=cfg.paths.features_dir,
        out_path=cfg.eval_path("popularity"),
        cfg=cfg.evaluate,
        max_set_size=cfg.model.max_set_size,
    )
    _print_json(_without_curve(report))
    # the attribute models' yardstick; {"known": false, ...} when the article attributes are off
    attribute = evaluate_attribute_popularity(
        cfg.paths.features_dir, cfg.eval_path("popularity_attribute"), cfg.evaluate, cfg.model.max_set_size
    )
    _print_json(_without_curve(attribute))
    # the history models' yardstick; {"known": false, ...} when features.history is off
    history = evaluate_history_popularity(
        cfg.paths.features_dir, cfg.eval_path("popularity_history"), cfg.evaluate, cfg.model.max_set_size
    )
    _print_json(_without_curve(history))
    # the attribute models' yardstick where they read a history; {"known": false, ...} without either
    both = evaluate_attribute_history_popularity(
        cfg.paths.features_dir, cfg.eval_path("popularity_attribute_history"), cfg.evaluate, cfg.model.max_set_size
    )
    _print_json(_without_curve(both))
    if cfg.evaluate.fitb.enabled:  # the FITB questions every evaluation answers, for any other model to answer
        from contextual_bert.evaluation.fitb import split_questions, write_questions

        questions, outfit_ids, article_ids = split_questions(
            cfg.paths.features_dir, cfg.model.max_set_size, cfg.evaluate.fitb
        )
        write_questions(questions, outfit_ids, article_ids, cfg.fitb_questions_path())


def _cmd_optimum(cfg: Config, args) -> None:
    from contextual_bert.evaluation.optimum import HISTORY_RESULT, RESULTS, evaluate_history_optimum, evaluate_optimum

    results = evaluate_optimum(
        raw_dir=cfg.paths.raw_dir,
        features_dir=cfg.paths.features_dir,
        out_paths={name: cfg.eval_path(name) for name in RESULTS},
        cfg=cfg.evaluate,
        max_set_size=cfg.model.max_set_size,
    )
    # which outfits may be history follows the features stage's split (history.py)
    results[HISTORY_RESULT] = evaluate_history_optimum(
        cfg.paths.raw_dir,
        cfg.paths.features_dir,
        cfg.eval_path(HISTORY_RESULT),
        cfg.evaluate,
        cfg.model.max_set_size,
        split_rule=cfg.features.split,
    )
    _print_json({name: _without_curve(result) for name, result in results.items()})


def _cmd_report(cfg: Config, args) -> None:
    from contextual_bert.evaluation.report import build_report

    _print_json(build_report(cfg))


def _cmd_register(cfg: Config, args) -> None:
    from contextual_bert.registry.models import register_all

    _print_json(register_all(cfg))


def _cmd_promote(cfg: Config, args) -> None:
    from contextual_bert.registry.promotion import promote, rollback

    result = rollback(cfg) if args.rollback else promote(cfg)
    if (result.get("yardstick") or {}).get("worse"):  # never a model that counts worse than a count: said plainly
        print(f"contextual-bert promote: {result['decision']}", file=sys.stderr)
    _print_json(result)


def _cmd_describe_model(cfg: Config, args) -> None:
    from contextual_bert.data.feature_store import SPEC_FILE, load_spec
    from contextual_bert.model import describe_variants

    # The width of c: the features stage's spec when there is one (default_dim included); before the
    # features stage has run, the sum of params' embedding_dims; the paper's when there are none.
    d_context: int | None
    if (cfg.paths.features_dir / SPEC_FILE).exists():
        d_context = load_spec(cfg.paths.features_dir).d_context
    else:
        d_context = sum(cfg.features.embedding_dims.values()) or None
    _print_json(describe_variants(cfg.model, paper=args.paper, d_context=d_context))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="contextual-bert", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="the params file (default: params.yaml)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="<stage>")

    def add(name, handler, help_):
        p = sub.add_parser(name, help=help_)
        p.set_defaults(handler=handler)
        return p

    add("source", _cmd_source, "fingerprint the files the chosen source reads (paths.source_fingerprint)")
    add("ingest", _cmd_ingest, "write data/raw from the source chosen in params (ingest.source)").set_defaults(
        source_name=None
    )
    # One source forced, whatever ingest.source says: the same ingest, named by its source.
    add("generate", _cmd_ingest, "ingest synthetic stylist data (generate section)").set_defaults(
        source_name="synthetic"
    )
    add("generate-planted", _cmd_ingest, "ingest planted-signal data and its truth (planted)").set_defaults(
        source_name="planted"
    )
    p = add("import-hm", _cmd_ingest, "ingest the H&M Kaggle files (import_hm)")
    p.set_defaults(source_name="hm")
    p.add_argument(
        "--source",
        help="folder with transactions_train.csv, customers.csv, articles.csv (each may be .csv.gz or .parquet)",
    )
    p = add("import-sets", _cmd_ingest, "ingest curated sets, pairs or Polyvore JSON (import_sets)")
    p.set_defaults(source_name="sets")
    p.add_argument("--source", help="a .csv/.parquet/.jsonl file of (outfit, item) pairs or a Polyvore .json")
    add("validate", _cmd_validate, "validate data/raw with Great Expectations, quarantine failing rows")
    add("features", _cmd_features, "build context embedding tables, article vocabulary and splits")
    for name, handler, help_ in (
        ("train", _cmd_train, "train one model for one seed"),
        ("evaluate", _cmd_evaluate, "evaluate one trained run on the test split (full ranking)"),
    ):
        p = add(name, handler, help_)
        p.add_argument("--model", required=True, choices=MODELS)
        p.add_argument("--seed", type=int, required=True)
    add("baseline", _cmd_baseline, "compute the yardsticks (the counting rules) on the test split")
    add("optimum", _cmd_optimum, "evaluate the Bayes-optimal predictor of planted data (with/without context)")
    add("report", _cmd_report, "Table 1, metrics.json and plots under reports/")
    add("register", _cmd_register, "register every evaluated run in the MLflow model registry")
    p = add("promote", _cmd_promote, "point alias 'champion' at the best version, if it beats the current one")
    p.add_argument("--rollback", action="store_true", help="restore the previous champion")
    p = add("describe-model", _cmd_describe_model, "counted parameters of every conditioning variant, as JSON")
    p.add_argument("--paper", action="store_true", help="at the paper's sizes instead of params.yaml's")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.params) if Path(args.params).exists() or args.params != "params.yaml" else Config()
        args.handler(cfg, args)
    except ContextualBertError as exc:
        print(f"contextual-bert {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
