"""Full-ranking evaluation: every item of every held-out outfit is masked in turn and ranked against the
whole article vocabulary (never sampled negatives).

A case is (outfit, position). Its target is ranked among the real articles, the outfit's other items
excluded; the special indices are never ranked. Ties (which only a constant scorer such as the popularity
baseline has) are broken by article index, so a rank is a position in one deterministic order:
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

The popularity baseline's scores are log(1 + training count). The attribute-aware popularity
(AttributePopularityModel) is the yardstick of the attribute models. The counts (these two and the history
popularity) are ranked from their closed form (`ranked_cases`, ranking.ScoreOrder), without scoring the catalogue
for every case: the ranks of the scored catalogue, the log-probabilities within a rounding (the log-sum-exp in
float64; popularity's the same bits).

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
import torch
from torch import nn

from contextual_bert.evaluation.bootstrap import (DEPENDENCE_METRIC, KNOWN_OUTFITS_KEY, OUTFITS_KEY, bootstrap_ci, case_values,
                                       outfit_record)
from contextual_bert.config import NOT_APPLICABLE, EvaluateConfig, ModelConfig, uses_attributes
from contextual_bert.devices import evaluation_device, keep_freed_memory
from contextual_bert.errors import ContextualBertError
from contextual_bert.data.feature_spec import HISTORY_FEATURE, N_SPECIAL, PAD_INDEX, UNKNOWN_INDEX, EncodedOutfits
from contextual_bert.evaluation.fitb import RESULT_KEY as FITB_KEY
from contextual_bert.evaluation.fitb import fitb_result, split_questions
from contextual_bert.model import count_paper_parameters, load_checkpoint
from contextual_bert.evaluation.ranking import (ScoreOrder, case_ranks, distinct_real, is_ahead, measures_dependence,
                                                 others_ahead, outfit_dependence)
from contextual_bert.evaluation.yardstick import VERDICT_KEY, run_verdict, yardstick_of

RECALL_CURVE_MAX_K = 250
CLOSED_FORM_CELLS = 1 << 20  # (cases x attribute values) the attribute popularity's closed form holds at a time


def _once(model: nn.Module, name, build):
    """`build()` once per device of the model's buffers: a count model's orders, kept across the chunks of
    cases that case_ranks hands its `ranked_cases`."""
    device = next(model.buffers()).device
    built = model.__dict__.setdefault("_built", {})
    if name not in built or built[name][0] != device:
        built[name] = (device, build())
    return built[name][1]


class PopularityModel(nn.Module):
    """Scores every article by its training count, whatever the outfit and the customer."""

    def __init__(self, counts):
        super().__init__()
        counts = torch.tensor(np.array(counts, dtype=np.float64))
        scores = torch.log1p(counts).float()
        scores[:N_SPECIAL] = float("-inf")
        self.register_buffer("scores", scores)
        self.n_items = len(scores)

    def masked_logits(self, items: torch.Tensor, context=None) -> torch.Tensor:
        return self.scores.expand(items.shape[0], -1).clone()

    def ranked_cases(self, others: torch.Tensor, context, target: torch.Tensor, with_ranks: bool):
        """ranking.case_ranks's log-probabilities and ranks of `target` without scoring the catalogue per case:
        one score vector, one order (`ScoreOrder`), one log-sum-exp."""
        score = self.scores[target]
        log_prob = score - torch.logsumexp(self.scores[None, N_SPECIAL:], dim=1)
        if not with_ranks:
            return log_prob, None
        ahead = _once(self, "order", lambda: ScoreOrder(self.scores)).count_ahead(score, target)
        return log_prob, 1 + ahead - others_ahead(others, lambda a: self.scores[a], score, target)


class AttributePopularityModel(nn.Module):
    """Popularity that knows one attribute (e.g. product type): P(a | O) = P(v(a) | O) P(a | v(a)).

    P(v | O): the values not yet among the outfit's other articles share 1 - r of the mass in proportion to
    their articles' training counts (+1), those already in it share r the same way; r is the share of
    training cases whose target's value is already among the other items (0 when, as on planted data, no
    two articles of one type share an outfit; floored at 1e-6 so a case that breaks the rule stays finite).
    P(a | v): the value's articles with an id by their training count, sharing 1 - u; its articles without
    an id share u equally. u is what the training outfits say of articles without an id: the share of train
    item occurrences of such articles (below features.min_article_count) plus, Good-Turing, of articles with
    an id seen exactly once. A value without articles of one kind gives the other kind all its mass.
    """

    def __init__(self, values: np.ndarray, counts: np.ndarray, n_ids: int, in_outfit_share: float):
        super().__init__()
        values = np.asarray(values, dtype=np.int64)  # (n_items,) the attribute's index per article; specials: 0
        counts = np.asarray(counts, dtype=np.float64)
        n, n_values = len(values), int(values.max()) + 1
        real = np.arange(n) >= N_SPECIAL
        has_id = real & (np.arange(n) < n_ids)
        unseen = real & ~has_id
        total = counts[real].sum()
        u = float(np.clip((counts[unseen].sum() + (counts[has_id] == 1).sum()) / max(total, 1.0), 1e-6, 1 - 1e-6))
        known_mass = np.bincount(values[has_id], weights=counts[has_id], minlength=n_values)
        n_unseen = np.bincount(values[unseen], minlength=n_values).astype(np.float64)
        share_known = np.where(n_unseen > 0, 1.0 - u, 1.0)
        share_unseen = np.where(known_mass > 0, u, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_within = np.where(has_id, np.log(share_known[values] * counts / known_mass[values]),
                                  np.log(share_unseen[values] / n_unseen[values]))  # fmt: skip
        log_within[~real] = -np.inf
        value_mass = np.bincount(values[real], weights=counts[real], minlength=n_values) + np.bincount(
            values[real], minlength=n_values).clip(max=1)  # + 1 per value an article has
        value_mass[0] = 0.0  # PAD: no article
        self.register_buffer("values", torch.from_numpy(values))
        self.register_buffer("log_within", torch.from_numpy(log_within).float())
        self.register_buffer("value_mass", torch.from_numpy(value_mass).float())
        self.r = float(np.clip(in_outfit_share, 1e-6, 1 - 1e-6))
        self.n_items, self.n_ids = n, n_ids

    def masked_logits(self, items: torch.Tensor, context=None) -> torch.Tensor:
        return self.log_value(items).gather(1, self.values.expand(items.shape[0], -1)) + self.log_within

    def log_value(self, items: torch.Tensor) -> torch.Tensor:
        """(B, n_values) log P(v | O) of every attribute value given the outfit's other items `items`."""
        present = torch.zeros(items.shape[0], len(self.value_mass), dtype=torch.bool, device=items.device)
        present.scatter_(1, self.values[items], True)
        present[:, 0] = False  # PAD / [MASK] / specials carry value 0
        mass = self.value_mass.expand_as(present)
        inside = (mass * present).sum(dim=1, keepdim=True)
        outside = (mass * ~present).sum(dim=1, keepdim=True)
        # a row with no value inside (or none left outside) gives the other side all the mass
        log_r = torch.where(outside > 0, math.log(self.r), 0.0)
        log_not_r = torch.where(inside > 0, math.log1p(-self.r), 0.0)
        return torch.where(present, log_r + mass.log() - inside.log(),
                           log_not_r + mass.log() - outside.log())  # fmt: skip

    def ranked_cases(self, others: torch.Tensor, context, target: torch.Tensor, with_ranks: bool):
        """ranking.case_ranks's log-probabilities and ranks of `target` without scoring the catalogue per case.
        A case's score of article a is log P(v(a) | O) + log P(a | v(a)): within a value's articles, ordered by
        log P(a | v) (`_groups`), those ahead of the target are a prefix found by binary search, and the log-sum-
        exp is over the values (in float64). A case whose scores tie the target's across articles of different
        log P(a | v) (a rounding) is ranked from its scores instead. A few cases at a time where the attribute has
        many values (a (cases x values) table of at most CLOSED_FORM_CELLS)."""
        rows = max(1, CLOSED_FORM_CELLS // len(self.value_mass))
        if len(target) > rows:
            parts = [self.ranked_cases(others[i : i + rows], context, target[i : i + rows], with_ranks)
                     for i in range(0, len(target), rows)]
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]) if with_ranks else None
        log_value = self.log_value(others)
        score = log_value.gather(1, self.values[target][:, None])[:, 0] + self.log_within[target]
        # a value without real articles adds nothing (its log_value can be NaN)
        norm = _once(self, "norm", self._log_value_norm)
        log_prob = score.double() - torch.logsumexp(torch.where(norm > -math.inf, log_value.double() + norm,
                                                                -math.inf), dim=1)
        if not with_ranks:
            return log_prob, None
        ahead, unsure = self._ahead_by_value(log_value, score, target)
        rank = 1 + ahead - others_ahead(
            others, lambda a: log_value.gather(1, self.values[a]) + self.log_within[a], score, target)
        if unsure.any():
            logits = self.masked_logits(others[unsure]).scatter(1, others[unsure], float("-inf"))
            index = torch.arange(self.n_items, device=others.device)
            rank[unsure] = 1 + is_ahead(logits, index, score[unsure, None], target[unsure, None]).sum(dim=1)
        return log_prob, rank

    def _log_value_norm(self) -> torch.Tensor:
        """(n_values,) float64 log of the sum of P(a | v) over each value's articles (0 where they sum to 1)."""
        within = torch.zeros(len(self.value_mass), dtype=torch.float64, device=self.values.device)
        return within.index_add_(0, self.values, self.log_within.double().exp()).log()

    def _groups(self):
        """The articles by value, each value's by log P(a | v) descending, ties by index: (log P sorted,
        article sorted, each value's first position, its end)."""
        by_index = torch.arange(self.n_items, device=self.values.device)
        order = torch.sort(-self.log_within, stable=True).indices
        order = order[torch.sort(self.values[order], stable=True).indices]
        ends = torch.cumsum(torch.bincount(self.values, minlength=len(self.value_mass)), 0)
        return self.log_within[order], by_index[order], ends - torch.bincount(
            self.values, minlength=len(self.value_mass)), ends

    def _ahead_by_value(self, log_value: torch.Tensor, score: torch.Tensor, target: torch.Tensor):
        """(C,) how many articles rank ahead of each case's target, and which cases could not be counted so
        (their tie with the target spans articles of different log P(a | v))."""
        within, article, first, end = _once(self, "groups", self._groups)
        steps = int(torch.log2((end - first).max().double().clamp_min(1.0)).floor()) + 2
        score = score[:, None]

        def prefix(beats):  # per (case, value): the length of the prefix of the value's articles that `beats`
            lo, hi = first.expand_as(log_value).clone(), end.expand_as(log_value).clone()
            for _ in range(steps):
                mid = (lo + hi) // 2
                yes = (lo < hi) & beats(log_value + within[mid.clamp_max(len(within) - 1)])
                lo, hi = torch.where(yes, mid + 1, lo), torch.where(yes | (lo >= hi), hi, mid)
            return lo

        above, at_least = prefix(lambda s: s > score), prefix(lambda s: s >= score)
        tied = at_least > above
        last = (at_least - 1).clamp_min(0)
        unsure = (tied & (within[above.clamp_max(len(within) - 1)] != within[last])).any(dim=1)
        # within a tie of one log P(a | v) the articles are in index order: those before the target
        lo, hi = above.clone(), at_least.clone()
        for _ in range(steps):
            mid = (lo + hi) // 2
            yes = (lo < hi) & (article[mid.clamp_max(len(article) - 1)] < target[:, None])
            lo, hi = torch.where(yes, mid + 1, lo), torch.where(yes | (lo >= hi), hi, mid)
        return (above - first + torch.where(tied, lo - above, 0)).sum(dim=1), unsure


class HistoryPopularityModel(nn.Module):
    """Per-customer popularity mixed with the global one: P(a) = (1 - w) P_pop(a) + w P_hist(a), P_pop as
    PopularityModel's softmax ((1 + count) / sum), P_hist uniform over the articles of the customer's history
    (the features stage's history feature, as every model reads it). Without history, popularity alone. The
    yardstick of the models with history: what counting the customer's own articles gives, nothing learned."""

    def __init__(self, counts, weight: float, feature: str = HISTORY_FEATURE):
        super().__init__()
        probs = torch.tensor(np.array(counts, dtype=np.float64) + 1.0)
        probs[:N_SPECIAL] = 0.0
        self.register_buffer("probs", (probs / probs.sum()).float())
        self.weight, self.feature = float(weight), feature
        self.n_items = len(probs)

    def masked_logits(self, items: torch.Tensor, context=None) -> torch.Tensor:
        history = context[self.feature]
        seen = torch.zeros(items.shape[0], self.n_items, device=items.device).scatter_(1, history, 1.0)
        seen[:, :N_SPECIAL] = 0.0  # PAD, and [UNK] an id model reads for an article it lacks: no one article
        n = seen.sum(dim=1, keepdim=True)
        weight = torch.where(n > 0, self.weight, 0.0)
        mixed = (1 - weight) * self.probs + weight * seen / n.clamp_min(1.0)
        return mixed.log().index_fill_(1, torch.arange(N_SPECIAL, device=items.device), float("-inf"))

    def ranked_cases(self, others: torch.Tensor, context, target: torch.Tensor, with_ranks: bool):
        """ranking.case_ranks's log-probabilities and ranks of `target` without scoring the catalogue per case.
        Outside a case's history every article scores the popularity part alone, one vector for every case
        with a history and one for those without (`ScoreOrder`); the history's few articles are then counted
        at their own scores. The log-sum-exp is taken in float64."""
        history, first = distinct_real(context[self.feature])
        n = first.sum(dim=1, keepdim=True).float()
        weight = torch.where(n > 0, self.weight, 0.0)  # (C, 1): as masked_logits

        def score_of(articles, in_history):  # masked_logits's arithmetic for these articles of each case
            return ((1 - weight) * self.probs[articles] + weight * in_history.float() / n.clamp_min(1.0)).log()

        def held(articles):  # (C, k) is each article in its case's history
            return ((articles[:, :, None] == history[:, None, :]) & first[:, None, :]).any(dim=2)

        score = score_of(target[:, None], held(target[:, None]))[:, 0]
        base_of, orders = _once(self, ("orders", self.weight), self._orders)
        has = n[:, 0] > 0
        base = torch.where(has[:, None], base_of[self.weight][history], base_of[0.0][history])
        mine = score_of(history, torch.ones_like(first))
        norm = torch.where(has, base_of[self.weight].double().exp().sum(), base_of[0.0].double().exp().sum())
        norm = norm + torch.where(first, mine.double().exp() - base.double().exp(), 0.0).sum(dim=1)
        log_prob = score.double() - norm.log()
        if not with_ranks:
            return log_prob, None
        ahead = torch.where(has, orders[self.weight].count_ahead(score, target),
                            orders[0.0].count_ahead(score, target))
        beside = (first & is_ahead(mine, history, score[:, None], target[:, None])).sum(dim=1)
        counted = (first & is_ahead(base, history, score[:, None], target[:, None])).sum(dim=1)
        rank = 1 + ahead - counted + beside - others_ahead(others, lambda a: score_of(a, held(a)), score, target)
        return log_prob, rank

    def _orders(self):
        """Every article's score outside a history, for a case with one (weight w) and without (0), and their
        `ScoreOrder`s."""
        base_of = {0.0: self.probs.log(), self.weight: ((1 - torch.tensor(self.weight)) * self.probs).log()}
        return base_of, {w: ScoreOrder(base) for w, base in base_of.items()}


HISTORY_WEIGHTS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)  # the history popularity's weights, tried on val


def in_outfit_share(items: torch.Tensor, values: np.ndarray) -> float:
    """The share of cases (every item of every outfit) whose value is also another item's value."""
    values = torch.from_numpy(np.asarray(values, dtype=np.int64))
    v = values[items]
    real = items >= N_SPECIAL
    same = (v.unsqueeze(2) == v.unsqueeze(1)) & real.unsqueeze(2) & real.unsqueeze(1)
    same &= ~torch.eye(items.shape[1], dtype=torch.bool)
    return float(same.any(dim=2)[real].float().mean()) if bool(real.any()) else 0.0


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


def evaluate_split(model, data: EncodedOutfits, cfg: EvaluateConfig, device, dependence: bool = True
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
    metrics = {"n_outfits": int(len(np.unique(cases["outfit"][keep]))),
               **metrics_from_ranks(cases["rank"][keep], cases["log_prob"][keep], cfg.ks)}
    interval = bootstrap_ci(cases["outfit"][keep], case_values(cases["rank"][keep], cases["log_prob"][keep]),
                            n_outfits=n_outfits)
    return metrics, interval


def evaluate_model(model, name, variant, seed, parameters, features_dir, max_set_size, out_path, cfg,
              n_ids: int | None = None, extra_context=None) -> dict:
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
        "variant": variant,
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
                test_cases, keep, len(test_data), cfg)
        # the known targets are the cases a model of ids only ranks: this record pairs with that model's
        result[KNOWN_OUTFITS_KEY] = outfit_record(test_cases["outfit"][known], {
            m: v[known] for m, v in test_values.items()}, _outfit_ids(test_data))
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
    lists = {}

    def placeholder(values: list) -> str:
        key = f"\x00list{len(lists)}"  # a string no result holds: it is swapped for the list below
        lists[json.dumps(key)] = json.dumps(values)
        return key

    short = {key: {"outfit_id": placeholder(record["outfit_id"]), "cases": placeholder(record["cases"]),
                   "sums": {m: placeholder(v) for m, v in record["sums"].items()}}
             for key in (OUTFITS_KEY, KNOWN_OUTFITS_KEY) if (record := result.get(key)) is not None}
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
    if NOT_APPLICABLE in trained:  # a model this data cannot train (training.loop.not_applicable): said, not failed
        result = {"known": False, "name": run_dir.name, "variant": trained["variant"], "why": trained[NOT_APPLICABLE]}
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(json.dumps(result, indent=2))
        return result
    if not (run_dir / "checkpoint.pt").exists() and (run_dir / "history.json").exists():
        # trained, yet no epoch gave a finite validation cross-entropy: training again will not help
        raise ContextualBertError(
            f"{run_dir}: trained ({run_dir / 'history.json'}) but no checkpoint was kept: no epoch had a finite "
            "validation cross-entropy; check the validation split (`contextual-bert features`, "
            "features.min_known_targets) before training again")
    model, meta = load_checkpoint(run_dir / "checkpoint.pt")
    n_items = len(load_article_vocab(features_dir))
    if n_items != model.n_ids:
        raise ContextualBertError(
            f"{run_dir / 'checkpoint.pt'}: trained on {model.n_ids} article indices but {features_dir} "
            f"has {n_items}; the features changed since training, train again"
        )
    n_ids = None
    if uses_attributes(model.variant):  # ranks the features stage's catalogue, the same as in training
        catalogue = load_catalogue(features_dir)
        model.set_catalogue(catalogue.tensors())
        n_ids = catalogue.n_ids
    result = evaluate_model(model, run_dir.name, model.variant, meta.get("seed"), count_paper_parameters(model),
                            features_dir, model.model_cfg.max_set_size, out_path, cfg, n_ids)
    name = yardstick_of(model.variant, model.reads_history)
    result[VERDICT_KEY] = run_verdict(result, name, yardstick_test_record(name, features_dir, cfg,
                                                                          model.model_cfg.max_set_size))
    Path(out_path).write_text(result_json(result))
    return result


def yardstick_test_record(name: str, features_dir: Path, cfg: EvaluateConfig, max_set_size: int) -> dict | None:
    """The yardstick `name` on the test split as the baseline stage computes it: its cross-entropy and per-outfit
    record, for the paired verdict; None where the data has none. Computed here rather than read from the
    baseline stage's file, so that an evaluation needs nothing but the features (a training unit on another
    machine has them)."""
    from contextual_bert.data.feature_store import load_split

    catalogue = name == "popularity_attribute"
    try:
        model = yardstick_model(name, features_dir, cfg, max_set_size, load_split(features_dir, "val", max_set_size))
    except ContextualBertError:
        return None
    test = load_split(features_dir, "test", max_set_size, catalogue=catalogue)
    device = evaluation_device()
    metrics, cases = evaluate_split(model.to(device), test, cfg, device)
    return {"test": metrics, OUTFITS_KEY: outfit_record(cases["outfit"], case_values(cases["rank"], cases["log_prob"]),
                                                        _outfit_ids(test))}


def evaluate_popularity(
    features_dir: Path, out_path: Path, cfg: EvaluateConfig, max_set_size: int = ModelConfig().max_set_size
) -> dict:
    """The popularity baseline (training counts) through the same ranking code; write out_path (JSON)."""
    from contextual_bert.data.feature_store import load_article_vocab

    counts = np.asarray(load_article_vocab(features_dir).counts)
    if not math.isfinite(float(counts.sum())) or (counts < 0).any():
        raise ContextualBertError(f"{features_dir}: article counts must be finite and non-negative")
    return evaluate_model(PopularityModel(counts), "popularity", "popularity", None, 0,
                     features_dir, max_set_size, out_path, cfg)  # fmt: skip


def evaluate_history_popularity(features_dir: Path, out_path: Path, cfg: EvaluateConfig,
                                max_set_size: int = ModelConfig().max_set_size) -> dict:
    """HistoryPopularityModel, its weight the one of HISTORY_WEIGHTS with the lowest validation cross-entropy;
    write out_path. Without a history feature (features.history off) {"known": false, "why": ...}."""
    from contextual_bert.data.feature_store import load_article_vocab, load_spec, load_split

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if not any(f.source == "history" for f in load_spec(features_dir).features):
        result = {"known": False, "why": "features.history is off: the features hold no history"}
        out_path.write_text(json.dumps(result, indent=2))
        return result
    counts = np.asarray(load_article_vocab(features_dir).counts)
    weight, by_weight = history_weight(counts, load_split(features_dir, "val", max_set_size), cfg)
    result = evaluate_model(HistoryPopularityModel(counts, weight), "popularity_history", "popularity_history", None, 0,
                            features_dir, max_set_size, out_path, cfg)
    result |= {"weight": weight, "val_cross_entropy_by_weight": {str(w): ce for w, ce in by_weight.items()}}
    out_path.write_text(result_json(result))
    return result


def history_weight(counts, val: EncodedOutfits, cfg: EvaluateConfig) -> tuple[float, dict[float, float]]:
    """The history popularity's weight: the one of HISTORY_WEIGHTS with the lowest cross-entropy on `val`, all
    of them from one pass over its cases (`history_log_probs`) instead of a ranking pass each."""
    log_probs = history_log_probs(counts, val, HISTORY_WEIGHTS)
    by_weight = {w: float(-log_probs[:, i].mean()) for i, w in enumerate(HISTORY_WEIGHTS)}
    return min(by_weight, key=by_weight.get), by_weight


def history_log_probs(counts, data: EncodedOutfits, weights, feature: str = HISTORY_FEATURE) -> np.ndarray:
    """(cases, weights) HistoryPopularityModel's log-probability of every case's target in `data` (the cases of
    case_ranks: every known target, outfit order), at each of `weights`, without scoring the catalogue: the
    mixture's probabilities sum to 1 over the real articles, so a case's log-probability is the log of its
    target's, (1 - w) P_pop(t) + w [t in the history] / n. The same numbers as the model's ranking pass but for
    its float32 sum over the catalogue (a rounding: within 2e-6 nats a case)."""
    probs = torch.tensor(np.array(counts, dtype=np.float64) + 1.0)
    probs[:N_SPECIAL] = 0.0
    probs /= probs.sum()
    items = data.items
    outfit, position = (items != PAD_INDEX).nonzero(as_tuple=True)
    target = items[outfit, position]
    known = target != UNKNOWN_INDEX
    outfit, target = outfit[known], target[known]
    history = data.context[feature]
    n = distinct_real(history)[1].sum(dim=1).double()[outfit]  # as HistoryPopularityModel's `seen` counts them
    in_history = ((history[outfit] == target[:, None]) & (history[outfit] >= N_SPECIAL)).any(dim=1).double()
    weight = torch.tensor(weights, dtype=torch.float64)[None, :] * (n > 0).double()[:, None]
    mixed = (1 - weight) * probs[target][:, None] + weight * (in_history / n.clamp_min(1.0))[:, None]
    return mixed.log().numpy()


def attribute_popularity_model(features_dir: Path, cfg: EvaluateConfig, max_set_size: int):
    """(AttributePopularityModel over the catalogue, its attribute, its in-outfit share), or (None, why, None)
    where the data has none (features.article_features off, or evaluate.popularity_attribute unset)."""
    from contextual_bert.data.feature_store import ATTRIBUTES_FILE, load_catalogue, load_split

    attribute = cfg.popularity_attribute
    if not (Path(features_dir) / ATTRIBUTES_FILE).exists():
        return None, ("no catalogue with attributes (features.article_features is off, or "
                      "features.article_attributes declares none for this source)"), None
    if attribute is None:
        return None, "evaluate.popularity_attribute is not set", None
    catalogue = load_catalogue(features_dir)
    if attribute not in catalogue.attributes or catalogue.attributes[attribute].ndim != 1:
        categorical = [f.name for f in catalogue.spec.features if not f.is_list]
        raise ContextualBertError(f"evaluate.popularity_attribute '{attribute}' is not a single-valued article "
                                  f"attribute of {features_dir} (those are {categorical})")
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
    model, why, _ = attribute_popularity_model(features_dir, cfg, max_set_size)
    if model is None:
        raise ContextualBertError(f"{features_dir}: no attribute-aware popularity ({why})")
    return model


def evaluate_attribute_popularity(features_dir: Path, out_path: Path, cfg: EvaluateConfig,
                                  max_set_size: int = ModelConfig().max_set_size) -> dict:
    """The attribute-aware popularity (evaluate.popularity_attribute) over the catalogue; write out_path.

    Without the catalogue (features.article_features off) or without an attribute set, it writes
    {"known": false, "why": ...}, as the optimum stage does where there is no optimum."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    model, attribute, share = attribute_popularity_model(features_dir, cfg, max_set_size)
    if model is None:
        out_path.write_text(json.dumps({"known": False, "why": attribute}, indent=2))
        return {"known": False, "why": attribute}
    result = evaluate_model(model, "popularity_attribute", "popularity_attribute", None, 0, features_dir, max_set_size,
                            out_path, cfg, model.n_ids)
    result |= {"attribute": attribute, "in_outfit_share": share}
    out_path.write_text(result_json(result))
    return result
