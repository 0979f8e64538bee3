"""The optimum stage: the Bayes optimum of planted data (data/planted/optimum.py, where its formulas are) built
from the truth in data/raw and the features stage's index space, and scored like any model
(`evaluation.evaluate_model`: the same test cases, metrics and JSON as the popularity yardstick and the trained
models). Three rows: without context, with context, and with context and history (`HISTORY_RESULT`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import torch

from contextual_bert.config import EvaluateConfig, ModelConfig
from contextual_bert.data.planted.closet_optimum import (
    ClosetHistoryOptimum,
    build_closet_optimum,
    closet_history_log_prior,
)
from contextual_bert.data.planted.closets import ClosetTruth
from contextual_bert.data.planted.optimum import (
    OUTFIT_ROW,
    HistoryOptimum,
    build_optimum,
    context_keys,
    history_log_prior,
)
from contextual_bert.data.planted.tastes import PlantedTruth
from contextual_bert.data.sources.planted import load_truth, truth_exists
from contextual_bert.errors import ContextualBertError, DataError

RESULTS = {"optimum_context": True, "optimum_no_context": False}  # eval name -> uses the context
HISTORY_RESULT = "optimum_history"  # the optimum with context and history (data/planted/optimum.py)


def _customer_context(raw_dir: Path, features_dir: Path, customer_ids: np.ndarray, ignored=()):
    """(digits (C, D) int64, [(feature name, width)], radix (D,)): the encoded context of the truth's customers (in
    `customer_ids`' order) as the model sees it: every customer column of the features stage but the history and
    those `ignored` (the truth's ignored_context: planted columns of pure noise, independent of every latent)."""
    from contextual_bert.data.feature_store import load_context_indexer

    encoder = load_context_indexer(features_dir)
    customers_path = Path(raw_dir) / "customers.parquet"
    customers = pd.read_parquet(customers_path)
    pos = pd.Index(customers["customer_id"].astype(str)).get_indexer(customer_ids.astype(str))
    if (pos < 0).any():
        raise DataError(
            f"customer '{customer_ids[int(np.flatnonzero(pos < 0)[0])]}' of the truth is not in the table",
            path=customers_path,
        )
    # the customer's columns (features.history, when on, is the optimum with history's: evaluate_history_optimum)
    context = [f for f in encoder.spec.features if f.source != "history" and f.name not in ignored]
    if any(f.source != "customer" for f in context):
        raise ContextualBertError(
            f"{features_dir}: planted data has customer context only, but the features "
            "hold per-outfit context too; the data and its truth file disagree"
        )
    indices, _, _ = encoder.encode_arrays(customers.iloc[pos].reset_index(drop=True), source="customer")
    digits, radix, names = [], [], []
    for feature in context:
        block = indices[feature.name].reshape(len(pos), -1)
        digits.append(block)
        radix += [feature.cardinality] * block.shape[1]
        names.append((feature.name, block.shape[1]))
    return np.concatenate(digits, axis=1), names, radix


def optimum_from_features(raw_dir: Path, features_dir: Path, with_context: bool):
    """The optimum in the index space of `features_dir`, from the truth in `raw_dir` (a BayesOptimum, or a
    ClosetOptimum for planted closets)."""
    from contextual_bert.data.feature_store import load_article_vocab

    truth = load_truth(raw_dir)
    vocab = load_article_vocab(features_dir)
    build = build_closet_optimum if isinstance(truth, ClosetTruth) else build_optimum
    if not with_context:
        return build(truth, vocab.ids, with_context=False)
    ignored = getattr(truth, "ignored_context", ())
    return build(truth, vocab.ids, True, *_customer_context(raw_dir, features_dir, truth.customer_ids, ignored))


def evaluate_optimum(raw_dir: Path, features_dir: Path, out_paths: dict[str, Path], cfg: EvaluateConfig,
                     max_set_size: int = ModelConfig().max_set_size) -> dict:  # fmt: skip
    """Evaluate the optimum with and without context like the popularity yardstick; write one JSON each.

    `out_paths`: eval name (RESULTS' keys) -> file. Without a truth file (data not made by
    `generate-planted`) each file says {"known": false, "why": ...}, so the stage's outputs always exist."""
    from contextual_bert.evaluation.evaluate import evaluate_model, result_json

    results = {}
    for name, with_context in RESULTS.items():
        out_path = Path(out_paths[name])
        if not truth_exists(raw_dir):
            result: dict = {
                "name": name,
                "known": False,
                "why": f"{raw_dir} holds no planted truth: the optimum of this data is unknown",
            }
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(result, indent=2))
        else:
            model = optimum_from_features(raw_dir, features_dir, with_context)
            result = evaluate_model(model, name, name, None, 0, features_dir, max_set_size, out_path, cfg)
            for split in ("test", "val"):
                ce = result[split]["cross_entropy"]
                if ce is None or not np.isfinite(ce):
                    raise ContextualBertError(
                        f"{name}: {split} cross-entropy is {ce}: a case the truth gives "
                        "probability 0, so the data and its truth file disagree"
                    )
            result = {**result, "known": True}
            out_path.write_text(result_json(result))
        results[name] = result
    return results


def _history_unknown(raw_dir: Path, truth) -> str | None:
    """Why the history row cannot be computed here, or None."""
    from contextual_bert.data.contract import DATE_COLUMN

    if truth is None:
        return f"{raw_dir} holds no planted truth: the optimum of this data is unknown"
    if isinstance(truth, PlantedTruth) and not truth.has_customer_taste:
        return (
            "the planted customers have no hidden taste (planted.customer_taste_strength 0): a history says "
            "nothing beyond the context, the optimum with history is the one with context"
        )
    if DATE_COLUMN not in pq.read_schema(Path(raw_dir) / "outfits.parquet").names:
        return f"{raw_dir}/outfits.parquet has no {DATE_COLUMN} column: no outfit has a history"
    return None


def history_optimum_data(raw_dir: Path, features_dir: Path, split_rule: str = "hash"):
    """(the HistoryOptimum (ClosetHistoryOptimum for planted closets) over the features' vocabulary, {split: its
    cases' OUTFIT_ROW per load_split row}).

    The outfits are the features stage's (validated, split); their dates and raw articles come from
    raw_dir's outfits table, joined on outfit_id."""
    from contextual_bert.data.contract import DATE_COLUMN
    from contextual_bert.data.feature_store import OUTFITS_FILE, load_article_vocab
    from contextual_bert.data.history import earlier_outfits, eligible_rows

    truth = load_truth(raw_dir)
    features = pq.read_table(Path(features_dir) / OUTFITS_FILE, columns=["outfit_id", "customer_id", "split"])
    features = features.to_pandas()
    raw_path = Path(raw_dir) / "outfits.parquet"
    raw = pq.read_table(raw_path, columns=["outfit_id", "article_ids", DATE_COLUMN]).to_pandas()
    pos = pd.Index(raw["outfit_id"].astype(str)).get_indexer(features["outfit_id"].astype(str))
    if (pos < 0).any():
        raise DataError(f"outfit '{features['outfit_id'].iloc[int(np.flatnonzero(pos < 0)[0])]}' of the features "
                        "is not in the raw outfits", path=raw_path)  # fmt: skip
    raw = raw.iloc[pos].reset_index(drop=True)
    article_row = pd.Index(truth.article_ids.astype(str))
    article_rows = [article_row.get_indexer(list(ids)) for ids in raw["article_ids"]]
    customer_rows = pd.Index(truth.customer_ids.astype(str)).get_indexer(features["customer_id"].astype(str))
    if (customer_rows < 0).any() or any((rows < 0).any() for rows in article_rows):
        raise DataError("an outfit's customer or article is not in the planted truth; the data and its truth "
                        "file disagree", path=raw_path)  # fmt: skip
    split = features["split"].to_numpy()
    history = earlier_outfits(features["customer_id"].to_numpy(), raw[DATE_COLUMN],
                              eligible_rows(split, split_rule))  # fmt: skip
    wanted = np.flatnonzero(split != "train")
    vocab = load_article_vocab(features_dir)
    if isinstance(truth, PlantedTruth):
        log_prior = np.zeros((len(split), truth.n_tastes))
        log_prior[wanted] = history_log_prior(truth, customer_rows, article_rows, history, wanted)
        base = build_optimum(truth, vocab.ids, with_context=False)
        model: HistoryOptimum | ClosetHistoryOptimum = HistoryOptimum(
            base.item_type, base.item_log_share, base.oov_share, log_prior
        )
    else:  # planted closets: P(c | H, x), kept for the outfits that are scored (row_index: -1 for the others)
        digits, _, radix = _customer_context(raw_dir, features_dir, truth.customer_ids)
        log_prior = closet_history_log_prior(
            truth, context_keys(digits, radix), customer_rows, article_rows, history, wanted
        )
        row_index = np.full(len(split), -1)
        row_index[wanted] = np.arange(len(wanted))
        closets = build_closet_optimum(truth, vocab.ids, with_context=False)
        model = ClosetHistoryOptimum(
            closets.item_type,
            closets.fresh.log(),
            closets.rewear,
            closets.entry_customer,
            closets.entry_item,
            closets.entry_kappa,
            closets.oov_share,
            log_prior,
            row_index=row_index,
        )
    rows = {name: np.flatnonzero(split == name) for name in ("val", "test")}  # load_split keeps the file's order
    return (
        model,
        rows,
        {"n_history_outfits": {name: int(sum(len(history[o]) > 0 for o in r)) for name, r in rows.items()}},
    )


def evaluate_history_optimum(
    raw_dir: Path,
    features_dir: Path,
    out_path: Path,
    cfg: EvaluateConfig,
    max_set_size: int = ModelConfig().max_set_size,
    split_rule: str = "hash",
) -> dict:
    """The optimum with context and history, scored as the other rows (evaluation.evaluate_model: test and
    validation metrics, the bootstrap, FITB); {"known": false, "why": ...} where it is absent."""
    from contextual_bert.evaluation.evaluate import evaluate_model, result_json

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    why = _history_unknown(raw_dir, load_truth(raw_dir) if truth_exists(raw_dir) else None)
    if why:
        result: dict = {"name": HISTORY_RESULT, "known": False, "why": why}
        out_path.write_text(json.dumps(result, indent=2))
        return result
    model, rows, about = history_optimum_data(raw_dir, features_dir, split_rule)
    result = evaluate_model(
        model,
        HISTORY_RESULT,
        HISTORY_RESULT,
        None,
        0,
        features_dir,
        max_set_size,
        out_path,
        cfg,
        extra_context=lambda split: {OUTFIT_ROW: torch.from_numpy(rows[split])},
    )
    for split in ("test", "val"):
        ce = result[split]["cross_entropy"]
        if ce is None or not np.isfinite(ce):
            raise ContextualBertError(
                f"{HISTORY_RESULT}: {split} cross-entropy is {ce}: a case the truth gives "
                "probability 0, so the data and its truth file disagree"
            )
    result |= {"split_rule": split_rule, **about, "known": True}
    out_path.write_text(result_json(result))
    return result
