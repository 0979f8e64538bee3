"""Full-ranking evaluation: every item of every held-out outfit is masked in turn and ranked against the
whole article vocabulary (never sampled negatives).

A case is (outfit, position). Its target is ranked among the real articles, the outfit's other items
excluded; the special indices are never ranked. Ties (which only a constant scorer such as the popularity
yardstick has) are broken by article index, so a rank is a position in one deterministic order:
rank = 1 + #{a : s_a > s_t} + #{a < t : s_a = s_t}. A target that is [UNK] (an article unseen in training)
cannot be ranked: it is skipped and counted. Cross-entropy is the full softmax over all real articles.

Models with article attributes ("<model>_attrs") and the attribute-aware popularity rank the whole
catalogue (every article of the articles table): a target never seen in training is ranked too, and the
result holds the metrics of all targets ("test"), of the targets with an id embedding ("test_known") and of
those without ("test_unseen"), each with its bootstrap interval. Models of ids only rank the train
vocabulary as before and skip the unseen targets.

The result also holds, per test outfit, its id, its number of cases and the sums of their CI metrics
("test_outfits", bootstrap.outfit_record), all targets only: what the report pairs two models on (the paired
bootstrap) when a seed's SE is missing. Its lists, a number per test outfit, are written one line each.

With evaluate.fitb on (the default), every evaluation also answers the test split's fill-in-the-blank questions
(fitb.py, the same for every model): "fitb_easy" / "fitb_hard" accuracies among the test metrics, and a "fitb"
block with their bootstrap intervals and the questions' digest.

The counts (popularity, the attribute-aware popularity, popularity + own history) are counts.py's models,
ranked by the same code as every trained model.

Outfit dependence (trained models only, on the test split; "outfit_dependence" beside the cross-entropy): how
much the prediction at the masked position depends on the outfit's other articles through the encoder. Every case is
scored a second time with the encoder reading the other articles of another outfit of the same length (a
fixed random pairing, `donor_outfits`; the [MASK] at the same position, the customer's own context kept, and
for the attribute models the attribute-overlap offsets still those of the real outfit, so that the hand-built
rule does not count); the value is that cross-entropy minus the real one, in nats. A model that learned
nothing from the articles (a popularity table, with or without the attribute rule) shows ~0 however good its
loss; the bag of items shows what co-occurrence alone gives.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from contextual_bert.config import CURVE_FILE, NOT_APPLICABLE, EvaluateConfig, ModelConfig, uses_attributes
from contextual_bert.data.feature_spec import HISTORY_FEATURE, VECTOR_KIND, EncodedOutfits
from contextual_bert.devices import evaluation_device, keep_freed_memory
from contextual_bert.errors import ContextualBertError
from contextual_bert.evaluation.bootstrap import (
    DEPENDENCE_METRIC,
    KNOWN_OUTFITS_KEY,
    OUTFITS_KEY,
    bootstrap_ci,
    case_values,
    outfit_record,
)
from contextual_bert.evaluation.counts import (
    AttributeHistoryPopularityModel,
    AttributePopularityModel,
    HistoryPopularityModel,
    PopularityModel,
    attribute_history_weight,
    history_weight,
    in_outfit_share,
)
from contextual_bert.evaluation.fitb import RESULT_KEY as FITB_KEY
from contextual_bert.evaluation.fitb import fitb_result, split_questions
from contextual_bert.evaluation.ranking import case_ranks, measures_dependence, outfit_dependence
from contextual_bert.evaluation.yardstick import CATALOGUE_YARDSTICKS, VERDICT_KEY, run_verdict, yardstick_of
from contextual_bert.model import count_paper_parameters, load_checkpoint

RECALL_CURVE_MAX_K = 250
NO_HISTORY = "features.history is off: the features hold no history"  # a history yardstick's "why"


def metrics_from_ranks(ranks, log_probs, ks=(1, 5, 10, 50, 250)) -> dict:
    """Cross-entropy (nats), recall@k, MRR and NDCG@10 of cases with one relevant article each."""
    ranks = np.asarray(ranks, dtype=np.float64)
    log_probs = np.asarray(log_probs, dtype=np.float64)
    if len(ranks) != len(log_probs):
        raise ValueError(f"{len(ranks)} ranks but {len(log_probs)} log-probabilities")
    if (ranks < 1).any():
        raise ValueError("ranks start at 1")
    n = len(ranks)

    def mean(values) -> float | None:
        return float(np.mean(values)) if n else None

    metrics = {"n_cases": n, "cross_entropy": mean(-log_probs)}
    for k in ks:
        metrics[f"recall@{k}"] = mean(ranks <= k)
    metrics["mrr"] = mean(1.0 / ranks)
    metrics["ndcg@10"] = mean(np.where(ranks <= 10, 1.0 / np.log2(ranks + 1.0), 0.0))
    return metrics


def recall_curve(ranks, max_k: int = RECALL_CURVE_MAX_K) -> dict:
    ranks = np.asarray(ranks)
    ks = list(range(1, max_k + 1))
    counts = np.bincount(np.minimum(ranks, max_k + 1).astype(np.int64), minlength=max_k + 2)
    cumulative = np.cumsum(counts)[1 : max_k + 1]
    return {"k": ks, "values": [float(c / len(ranks)) if len(ranks) else None for c in cumulative]}


def evaluate_split(
    model, data: EncodedOutfits, cfg: EvaluateConfig, device, dependence: bool = True
) -> tuple[dict, dict]:
    """The metrics of one split and its cases (see case_ranks); with `dependence`, a trained model's outfit
    dependence too (a second forward of every case)."""
    cases = case_ranks(model, data, cfg.batch_size, device, dependence=dependence and measures_dependence(model))
    metrics = {
        "n_outfits": len(data),
        "n_unknown_targets": int(cases["n_unknown_targets"]),
        **metrics_from_ranks(cases["rank"], cases["log_prob"], cfg.ks),
    }
    if "log_prob_shuffled" in cases:
        metrics[DEPENDENCE_METRIC] = outfit_dependence(cases["log_prob"], cases["log_prob_shuffled"])
    return metrics, cases


def _subset_metrics(cases: dict, keep: np.ndarray, n_outfits: int, cfg: EvaluateConfig) -> tuple[dict, dict]:
    """Metrics and bootstrap interval of the cases where `keep` is true."""
    metrics = {
        "n_outfits": int(len(np.unique(cases["outfit"][keep]))),
        **metrics_from_ranks(cases["rank"][keep], cases["log_prob"][keep], cfg.ks),
    }
    interval = bootstrap_ci(
        cases["outfit"][keep], case_values(cases["rank"][keep], cases["log_prob"][keep]), n_outfits=n_outfits
    )
    return metrics, interval


def evaluate_model(
    model,
    name,
    model_name,
    seed,
    parameters,
    features_dir,
    max_set_size,
    out_path,
    cfg,
    n_ids: int | None = None,
    extra_context=None,
) -> dict:
    """n_ids: the model ranks the catalogue, whose articles below n_ids have an id embedding (known) and the
    others not (unseen); their metrics are reported apart as well. extra_context(split): entries a model needs
    beside the features' context, per row of that split (the optimum with history: each case's outfit)."""
    from contextual_bert.data.feature_store import load_split

    device = evaluation_device()
    if device.type == "cpu":
        keep_freed_memory()
    model.to(device)
    catalogue = n_ids is not None

    def split_data(split: str) -> EncodedOutfits:
        data = load_split(features_dir, split, max_set_size, catalogue=catalogue)
        data.context |= extra_context(split) if extra_context else {}
        return data

    test_data = split_data("test")
    test, test_cases = evaluate_split(model, test_data, cfg, device)
    # validation's outfit dependence would double its pass and nothing reads it: training's stuck check measures it
    val, _ = evaluate_split(model, split_data("val"), cfg, device, dependence=False)
    fitb = None
    if cfg.fitb.enabled:  # fill-in-the-blank on the same test outfits, the same questions for every model
        questions, _, _ = split_questions(features_dir, max_set_size, cfg.fitb)
        fitb_metrics, fitb = fitb_result(model, test_data, questions, cfg.fitb, cfg.batch_size, device)
        test |= fitb_metrics
    test_ranks = test_cases["rank"]
    test_values = case_values(test_ranks, test_cases["log_prob"])
    curve = recall_curve(test_ranks)
    result = {
        "name": name,
        "model": model_name,
        "seed": seed,
        "parameters": parameters,
        "test": test,
        "val": val,
        # how much the test metrics move with the test outfits themselves (bootstrap.py)
        "test_bootstrap": bootstrap_ci(test_cases["outfit"], test_values, n_outfits=test["n_outfits"]),
        # to pair this model with another on the same test cases (the report's paired bootstrap)
        OUTFITS_KEY: outfit_record(test_cases["outfit"], test_values, _outfit_ids(test_data)),
        "recall_curve": {"k": curve["k"], "test": curve["values"]},
        "ranked": "catalogue" if catalogue else "vocabulary",
        **({} if fitb is None else {FITB_KEY: fitb}),
    }
    if catalogue:
        known = test_cases["target"] < n_ids
        for part, keep in (("known", known), ("unseen", ~known)):
            result[f"test_{part}"], result[f"test_{part}_bootstrap"] = _subset_metrics(
                test_cases, keep, len(test_data), cfg
            )
        # the known targets are the cases a model of ids only ranks: this record pairs with that model's
        result[KNOWN_OUTFITS_KEY] = outfit_record(
            test_cases["outfit"][known], {m: v[known] for m, v in test_values.items()}, _outfit_ids(test_data)
        )
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(result_json(result))
    return result


def _outfit_ids(data: EncodedOutfits) -> list:
    # splits built without ids (tests) pair on the row, the same for every model on that split
    return list(range(len(data))) if data.outfit_ids is None else list(data.outfit_ids)


def result_json(result: dict) -> str:
    """An evaluation result as indented JSON, but the per-outfit records' lists on one line each: indented,
    they would be a line per test outfit and the bulk of the file."""
    lists: dict[str, str] = {}

    def placeholder(values: list) -> str:
        key = f"\x00list{len(lists)}"  # a string no result holds: it is swapped for the list below
        lists[json.dumps(key)] = json.dumps(values)
        return key

    short = {
        key: {
            "outfit_id": placeholder(record["outfit_id"]),
            "cases": placeholder(record["cases"]),
            "sums": {m: placeholder(v) for m, v in record["sums"].items()},
        }
        for key in (OUTFITS_KEY, KNOWN_OUTFITS_KEY)
        if (record := result.get(key)) is not None
    }
    text = json.dumps(result | short, indent=2)
    for key, values in lists.items():
        text = text.replace(key, values, 1)
    return text


def evaluate_run(features_dir: Path, run_dir: Path, out_path: Path, cfg: EvaluateConfig) -> dict:
    """Evaluate run_dir/checkpoint.pt on the test (and validation) split; write out_path (JSON), with where the
    model stands against its yardstick on the same test cases (yardstick.run_verdict)."""
    from contextual_bert.data.feature_store import load_article_vocab, load_catalogue

    run_dir = Path(run_dir)
    trained = json.loads((run_dir / "metrics.json").read_text()) if (run_dir / "metrics.json").exists() else {}
    if NOT_APPLICABLE in trained:  # a model this data cannot train (training.trainer.not_applicable): said, not failed
        # "variant": the key of a metrics.json written before issue 92
        model_name = trained["model"] if "model" in trained else trained["variant"]
        result = {"known": False, "name": run_dir.name, "model": model_name, "why": trained[NOT_APPLICABLE]}
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(json.dumps(result, indent=2))
        return result
    if not (run_dir / "checkpoint.pt").exists() and (run_dir / CURVE_FILE).exists():
        # trained, yet no epoch gave a finite validation cross-entropy: training again will not help
        raise ContextualBertError(
            f"{run_dir}: trained ({run_dir / CURVE_FILE}) but no checkpoint was kept: no epoch had a finite "
            "validation cross-entropy; check the validation split (`contextual-bert features`, "
            "features.min_known_targets) before training again"
        )
    model, meta = load_checkpoint(run_dir / "checkpoint.pt")
    n_items = len(load_article_vocab(features_dir))
    if n_items != model.n_ids:
        raise ContextualBertError(
            f"{run_dir / 'checkpoint.pt'}: trained on {model.n_ids} article indices but {features_dir} "
            f"has {n_items}; the features changed since training, train again"
        )
    n_ids = None
    if uses_attributes(model.name):  # ranks the features stage's catalogue, the same as in training
        catalogue = load_catalogue(features_dir)
        model.set_catalogue(catalogue.tensors())
        n_ids = catalogue.n_ids
    result = evaluate_model(
        model,
        run_dir.name,
        model.name,
        meta.get("seed"),
        count_paper_parameters(model),
        features_dir,
        model.model_cfg.max_set_size,
        out_path,
        cfg,
        n_ids,
    )
    name = yardstick_of(model.name, model.reads_history)
    result[VERDICT_KEY] = run_verdict(
        result, name, yardstick_test_record(name, features_dir, cfg, model.model_cfg.max_set_size)
    )
    Path(out_path).write_text(result_json(result))
    return result


def yardstick_test_record(name: str, features_dir: Path, cfg: EvaluateConfig, max_set_size: int) -> dict | None:
    """The yardstick `name` on the test split as the baseline stage computes it: its cross-entropy and per-outfit
    record, for the paired verdict; None where the data has none. Computed here rather than read from the
    baseline stage's file, so that an evaluation needs nothing but the features (a training unit on another
    machine has them)."""
    from contextual_bert.data.feature_store import load_split

    catalogue = name in CATALOGUE_YARDSTICKS
    try:
        model = yardstick_model(
            name, features_dir, cfg, max_set_size, load_split(features_dir, "val", max_set_size, catalogue=catalogue)
        )
    except ContextualBertError:
        return None
    test = load_split(features_dir, "test", max_set_size, catalogue=catalogue)
    device = evaluation_device()
    metrics, cases = evaluate_split(model.to(device), test, cfg, device)
    return {
        "test": metrics,
        OUTFITS_KEY: outfit_record(cases["outfit"], case_values(cases["rank"], cases["log_prob"]), _outfit_ids(test)),
    }


def evaluate_popularity(
    features_dir: Path, out_path: Path, cfg: EvaluateConfig, max_set_size: int = ModelConfig().max_set_size
) -> dict:
    """The popularity yardstick (training counts) through the same ranking code; write out_path (JSON)."""
    from contextual_bert.data.feature_store import load_article_vocab

    counts = np.asarray(load_article_vocab(features_dir).counts)
    if not math.isfinite(float(counts.sum())) or (counts < 0).any():
        raise ContextualBertError(f"{features_dir}: article counts must be finite and non-negative")
    return evaluate_model(PopularityModel(counts), "popularity", "popularity", None, 0,
                     features_dir, max_set_size, out_path, cfg)  # fmt: skip


def evaluate_history_popularity(
    features_dir: Path, out_path: Path, cfg: EvaluateConfig, max_set_size: int = ModelConfig().max_set_size
) -> dict:
    """HistoryPopularityModel, its weight the one of HISTORY_WEIGHTS with the lowest validation cross-entropy;
    write out_path. Without a history feature (features.history off) {"known": false, "why": ...}."""
    from contextual_bert.data.feature_store import load_article_vocab, load_spec, load_split

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if not any(f.source == "history" for f in load_spec(features_dir).features):
        result = {"known": False, "why": NO_HISTORY}
        out_path.write_text(json.dumps(result, indent=2))
        return result
    counts = np.asarray(load_article_vocab(features_dir).counts)
    weight, by_weight = history_weight(counts, load_split(features_dir, "val", max_set_size), cfg)
    result = evaluate_model(
        HistoryPopularityModel(counts, weight),
        "popularity_history",
        "popularity_history",
        None,
        0,
        features_dir,
        max_set_size,
        out_path,
        cfg,
    )
    result |= {"weight": weight, "val_cross_entropy_by_weight": {str(w): ce for w, ce in by_weight.items()}}
    out_path.write_text(result_json(result))
    return result


def attribute_popularity_model(features_dir: Path, cfg: EvaluateConfig, max_set_size: int):
    """(AttributePopularityModel over the catalogue, its attribute, its in-outfit share), or (None, why, None)
    where the data has none (features.article_features off, or evaluate.popularity_attribute unset)."""
    from contextual_bert.data.feature_store import ATTRIBUTES_FILE, load_catalogue, load_split

    attribute = cfg.popularity_attribute
    if not (Path(features_dir) / ATTRIBUTES_FILE).exists():
        return (
            None,
            (
                "no catalogue with attributes (features.article_features is off, or "
                "features.article_attributes declares none for this source)"
            ),
            None,
        )
    if attribute is None:
        return None, "evaluate.popularity_attribute is not set", None
    catalogue = load_catalogue(features_dir)
    if attribute not in catalogue.attributes or catalogue.attributes[attribute].ndim != 1:
        categorical = [f.name for f in catalogue.spec.features if not f.is_list and f.kind != VECTOR_KIND]
        raise ContextualBertError(
            f"evaluate.popularity_attribute '{attribute}' is not a single-valued article "
            f"attribute of {features_dir} (those are {categorical})"
        )
    values = catalogue.attributes[attribute]
    share = in_outfit_share(load_split(features_dir, "train", max_set_size, catalogue=True).items, values)
    return AttributePopularityModel(values, catalogue.vocab.counts, catalogue.n_ids, share), attribute, share


def yardstick_model(name: str, features_dir: Path, cfg: EvaluateConfig, max_set_size: int, val: EncodedOutfits):
    """The count `name` (yardstick.YARDSTICKS) built from the features as the baseline stage builds it; the
    history popularity's weight chosen on `val`. Promotion holds a candidate to it."""
    from contextual_bert.data.feature_store import load_article_vocab

    counts = np.asarray(load_article_vocab(features_dir).counts)
    if name == "popularity":
        return PopularityModel(counts)
    if name == "popularity_history":
        return HistoryPopularityModel(counts, history_weight(counts, val, cfg)[0])
    if name == "popularity_attribute_history":
        model, why = attribute_history_popularity_model(features_dir, cfg, max_set_size, val)
    else:
        model, why, _ = attribute_popularity_model(features_dir, cfg, max_set_size)
    if model is None:
        raise ContextualBertError(f"{features_dir}: no {name} ({why})")
    return model


def attribute_history_popularity_model(
    features_dir: Path, cfg: EvaluateConfig, max_set_size: int, val: EncodedOutfits | None = None
):
    """(AttributeHistoryPopularityModel, its validation cross-entropy by weight), its weight the one of
    HISTORY_WEIGHTS with the lowest on `val` (the catalogue's validation split, loaded when None); or (None, why)
    where the data has no attribute-aware popularity or no history."""
    from contextual_bert.data.feature_store import load_article_vocab, load_split

    attribute, why, _ = attribute_popularity_model(features_dir, cfg, max_set_size)
    if attribute is None:
        return None, why
    if val is None:
        val = load_split(features_dir, "val", max_set_size, catalogue=True)
    if HISTORY_FEATURE not in val.context:
        return None, NO_HISTORY
    counts = np.asarray(load_article_vocab(features_dir).counts)
    weight, by_weight = attribute_history_weight(attribute, counts, val, cfg)
    return AttributeHistoryPopularityModel(attribute, counts, weight), by_weight


def evaluate_attribute_history_popularity(
    features_dir: Path, out_path: Path, cfg: EvaluateConfig, max_set_size: int = ModelConfig().max_set_size
) -> dict:
    """The attribute-aware popularity lifted by the customer's own history (AttributeHistoryPopularityModel), its
    weight the one of HISTORY_WEIGHTS with the lowest validation cross-entropy, over the catalogue; write
    out_path. Without the attributes or the history {"known": false, "why": ...}."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    model, detail = attribute_history_popularity_model(features_dir, cfg, max_set_size)
    if model is None:
        out_path.write_text(json.dumps({"known": False, "why": detail}, indent=2))
        return {"known": False, "why": detail}
    weight, by_weight = model.weight, detail
    result = evaluate_model(
        model,
        "popularity_attribute_history",
        "popularity_attribute_history",
        None,
        0,
        features_dir,
        max_set_size,
        out_path,
        cfg,
        model.n_ids,
    )
    result |= {"weight": weight, "val_cross_entropy_by_weight": {str(w): ce for w, ce in by_weight.items()}}
    out_path.write_text(result_json(result))
    return result


def evaluate_attribute_popularity(
    features_dir: Path, out_path: Path, cfg: EvaluateConfig, max_set_size: int = ModelConfig().max_set_size
) -> dict:
    """The attribute-aware popularity (evaluate.popularity_attribute) over the catalogue; write out_path.

    Without the catalogue (features.article_features off) or without an attribute set, it writes
    {"known": false, "why": ...}, as the optimum stage does where there is no optimum."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    model, attribute, share = attribute_popularity_model(features_dir, cfg, max_set_size)
    if model is None:
        out_path.write_text(json.dumps({"known": False, "why": attribute}, indent=2))
        return {"known": False, "why": attribute}
    result = evaluate_model(
        model,
        "popularity_attribute",
        "popularity_attribute",
        None,
        0,
        features_dir,
        max_set_size,
        out_path,
        cfg,
        model.n_ids,
    )
    result |= {"attribute": attribute, "in_outfit_share": share}
    out_path.write_text(result_json(result))
    return result
