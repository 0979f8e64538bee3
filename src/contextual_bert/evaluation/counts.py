"""The counts: the yardsticks every trained model is set beside, nothing learned.

PopularityModel scores an article log(1 + training count). AttributePopularityModel (the yardstick of the
attribute models) knows one attribute, e.g. product type. HistoryPopularityModel (the yardstick of the models
with history) mixes popularity with the customer's own past articles, its weight chosen on validation
(`history_weight`); AttributeHistoryPopularityModel lifts the attribute-aware popularity by the same history (the
yardstick of the attribute models with history). Each has the `masked_logits` of any model and, but the last, a
closed form (`ranked_cases`,
ranking.ScoreOrder) that ranks a case's target without scoring the catalogue for every case: the ranks of the
scored catalogue, the log-probabilities within a rounding (the log-sum-exp in float64; popularity's the same
bits).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from contextual_bert.config import EvaluateConfig
from contextual_bert.data.feature_spec import (
    HISTORY_FEATURE,
    MASK_INDEX,
    N_SPECIAL,
    PAD_INDEX,
    UNKNOWN_INDEX,
    EncodedOutfits,
)
from contextual_bert.evaluation.ranking import ScoreOrder, distinct_real, is_ahead, others_ahead

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

    # buffers (register_buffer), typed for mypy
    scores: torch.Tensor

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

    # buffers (register_buffer), typed for mypy
    values: torch.Tensor
    log_within: torch.Tensor
    value_mass: torch.Tensor

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
            values[real], minlength=n_values
        ).clip(max=1)  # + 1 per value an article has
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
            parts = [
                self.ranked_cases(others[i : i + rows], context, target[i : i + rows], with_ranks)
                for i in range(0, len(target), rows)
            ]
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]) if with_ranks else None
        log_value = self.log_value(others)
        score = log_value.gather(1, self.values[target][:, None])[:, 0] + self.log_within[target]
        # a value without real articles adds nothing (its log_value can be NaN)
        norm = _once(self, "norm", self._log_value_norm)
        log_prob = score.double() - torch.logsumexp(
            torch.where(norm > -math.inf, log_value.double() + norm, -math.inf), dim=1
        )
        if not with_ranks:
            return log_prob, None
        ahead, unsure = self._ahead_by_value(log_value, score, target)
        rank = (
            1
            + ahead
            - others_ahead(others, lambda a: log_value.gather(1, self.values[a]) + self.log_within[a], score, target)
        )
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
        return (
            self.log_within[order],
            by_index[order],
            ends - torch.bincount(self.values, minlength=len(self.value_mass)),
            ends,
        )

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
    PopularityModel's softmax ((1 + count) / sum), P_hist(a) the share of the customer's history slots that hold
    a (the features stage's history feature, as every model reads it: an article once per earlier outfit that
    held it, so by how often the customer wore it). Without history, popularity alone. The
    yardstick of the models with history: what counting the customer's own articles gives, nothing learned."""

    # buffers (register_buffer), typed for mypy
    probs: torch.Tensor

    def __init__(self, counts, weight: float, feature: str = HISTORY_FEATURE):
        super().__init__()
        probs = torch.tensor(np.array(counts, dtype=np.float64) + 1.0)
        probs[:N_SPECIAL] = 0.0
        self.register_buffer("probs", (probs / probs.sum()).float())
        self.weight, self.feature = float(weight), feature
        self.n_items = len(probs)

    def masked_logits(self, items: torch.Tensor, context=None) -> torch.Tensor:
        history = context[self.feature]
        seen = torch.zeros(items.shape[0], self.n_items, device=items.device).scatter_add_(
            1, history, torch.ones(history.shape, device=items.device)
        )
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
        real = history >= N_SPECIAL
        n = real.sum(dim=1, keepdim=True).float()
        weight = torch.where(n > 0, self.weight, 0.0)  # (C, 1): as masked_logits

        def score_of(articles, worn):  # masked_logits's arithmetic for these articles of each case
            return ((1 - weight) * self.probs[articles] + weight * worn.float() / n.clamp_min(1.0)).log()

        def held(articles):  # (C, k) how many of its case's history slots hold each article
            return ((articles[:, :, None] == history[:, None, :]) & real[:, None, :]).sum(dim=2)

        score = score_of(target[:, None], held(target[:, None]))[:, 0]
        base_of, orders = _once(self, ("orders", self.weight), self._orders)
        has = n[:, 0] > 0
        base = torch.where(has[:, None], base_of[self.weight][history], base_of[0.0][history])
        mine = score_of(history, held(history))
        norm = torch.where(has, base_of[self.weight].double().exp().sum(), base_of[0.0].double().exp().sum())
        norm = norm + torch.where(first, mine.double().exp() - base.double().exp(), 0.0).sum(dim=1)
        log_prob = score.double() - norm.log()
        if not with_ranks:
            return log_prob, None
        ahead = torch.where(has, orders[self.weight].count_ahead(score, target), orders[0.0].count_ahead(score, target))
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


class AttributeHistoryPopularityModel(nn.Module):
    """The attribute-aware popularity lifted by the customer's own history as popularity + own history lifts
    popularity: P(a | O, H) proportional to P_attr(a | O) (1 + lambda k(a) / (n p(a))), lambda = w / (1 - w),
    for a history of n slots of which k(a) hold a and p(a) the article's popularity ((1 + count) / sum over the
    ids; an article without an id counts 0). With popularity for P_attr it is HistoryPopularityModel's mixture;
    it is the form of a model with attributes and history started from the counts (HistoryRepeat over the
    output bias), so the attribute models with history are held to it: what the type rule and counting the
    customer's own articles give together, nothing learned. Scored over the catalogue, no closed form."""

    # buffers (register_buffer), typed for mypy
    probs: torch.Tensor

    def __init__(self, attribute: AttributePopularityModel, counts, weight: float, feature: str = HISTORY_FEATURE):
        super().__init__()
        self.attribute = attribute
        self.register_buffer("probs", _catalogue_popularity(attribute.n_items, counts).float())
        self.weight, self.feature = float(weight), feature
        self.n_items, self.n_ids = attribute.n_items, attribute.n_ids

    def masked_logits(self, items: torch.Tensor, context=None) -> torch.Tensor:
        history = context[self.feature]
        held = history >= N_SPECIAL
        worn = torch.zeros(items.shape[0], self.n_items, device=items.device).scatter_add_(1, history, held.float())
        n = held.sum(dim=1, keepdim=True).clamp_min(1).float()
        lift = self.weight / (1 - self.weight) * worn / (n * self.probs)
        logits = self.attribute.masked_logits(items) + torch.log1p(lift)
        return logits.index_fill_(1, torch.arange(N_SPECIAL, device=items.device), float("-inf"))


def _catalogue_popularity(n_items: int, counts) -> torch.Tensor:
    """(n_items,) float64 p(a) = (1 + count) / sum over the ids, for every catalogue article (count 0 without
    an id)."""
    probs = torch.ones(n_items, dtype=torch.float64)
    probs[: len(counts)] += torch.tensor(np.asarray(counts, dtype=np.float64))
    return probs / probs[N_SPECIAL : len(counts)].sum()


def attribute_history_weight(
    attribute: AttributePopularityModel, counts, val: EncodedOutfits, cfg: EvaluateConfig
) -> tuple[float, dict[float, float]]:
    """AttributeHistoryPopularityModel's weight: the one of HISTORY_WEIGHTS with the lowest cross-entropy on
    `val` (its catalogue items), every weight from one pass (`attribute_history_log_probs`)."""
    log_probs = attribute_history_log_probs(attribute, counts, val, HISTORY_WEIGHTS, cfg.batch_size)
    by_weight = {w: float(-log_probs[:, i].mean()) for i, w in enumerate(HISTORY_WEIGHTS)}
    return min(by_weight, key=by_weight.__getitem__), by_weight


def attribute_history_log_probs(
    attribute: AttributePopularityModel,
    counts,
    data: EncodedOutfits,
    weights,
    batch_size: int,
    feature: str = HISTORY_FEATURE,
) -> np.ndarray:
    """(cases, weights) AttributeHistoryPopularityModel's log-probability of every case's target in `data` (the
    cases of case_ranks, outfit order) at each of `weights`, from one scoring of the attribute-aware popularity:
    with B = exp(its logits), Z = sum_a B(a), L(a) = k(a) / (n p(a)) and S = the sum of B L over the history's
    articles, P(t) = B(t) (1 + lambda L(t)) / (Z + lambda S). The same numbers as the model's ranking pass but for
    its float32 sums (a rounding)."""
    probs = _catalogue_popularity(attribute.n_items, counts)
    lam = torch.tensor([w / (1 - w) for w in weights], dtype=torch.float64)
    items = data.items
    outfit, position = (items != PAD_INDEX).nonzero(as_tuple=True)
    target = items[outfit, position]
    known = target != UNKNOWN_INDEX
    outfit, position, target = outfit[known], position[known], target[known]
    out = []
    with torch.no_grad():
        for start in range(0, len(target), batch_size):
            o, t = outfit[start : start + batch_size], target[start : start + batch_size, None]
            masked = items[o].clone()
            masked[torch.arange(len(o)), position[start : start + batch_size]] = MASK_INDEX
            logits = attribute.masked_logits(masked).double()[:, N_SPECIAL:]
            log_z = torch.logsumexp(logits, dim=1, keepdim=True)
            record = data.context[feature][o]  # (C, slots) the customer's history, an article once per wear
            history, first = distinct_real(record)
            slots = record >= N_SPECIAL
            n = slots.sum(dim=1, keepdim=True).clamp_min(1).double()
            worn = ((history[:, :, None] == record[:, None, :]) & slots[:, None, :]).sum(dim=2)
            lift = worn / (n * probs[history])  # (C, slots) L of each distinct history article
            held = logits.gather(1, (history - N_SPECIAL).clamp_min(0)) - log_z
            share = torch.where(first, (held.exp() * lift), 0.0).sum(dim=1, keepdim=True)  # S / Z
            lift_t = ((record == t) & slots).sum(dim=1, keepdim=True) / (n * probs[t])
            target_logit = logits.gather(1, t - N_SPECIAL) - log_z
            out.append(target_logit + torch.log1p(lam * lift_t) - torch.log1p(lam * share))
    return torch.cat(out).numpy() if out else np.zeros((0, len(weights)))


def in_outfit_share(items: torch.Tensor, values: np.ndarray) -> float:
    """The share of cases (every item of every outfit) whose value is also another item's value."""
    v = torch.from_numpy(np.asarray(values, dtype=np.int64))[items]
    real = items >= N_SPECIAL
    same = (v.unsqueeze(2) == v.unsqueeze(1)) & real.unsqueeze(2) & real.unsqueeze(1)
    same &= ~torch.eye(items.shape[1], dtype=torch.bool)
    return float(same.any(dim=2)[real].float().mean()) if bool(real.any()) else 0.0


def history_weight(counts, val: EncodedOutfits, cfg: EvaluateConfig) -> tuple[float, dict[float, float]]:
    """The history popularity's weight: the one of HISTORY_WEIGHTS with the lowest cross-entropy on `val`, all
    of them from one pass over its cases (`history_log_probs`) instead of a ranking pass each."""
    log_probs = history_log_probs(counts, val, HISTORY_WEIGHTS)
    by_weight = {w: float(-log_probs[:, i].mean()) for i, w in enumerate(HISTORY_WEIGHTS)}
    return min(by_weight, key=by_weight.__getitem__), by_weight


def history_log_probs(counts, data: EncodedOutfits, weights, feature: str = HISTORY_FEATURE) -> np.ndarray:
    """(cases, weights) HistoryPopularityModel's log-probability of every case's target in `data` (the cases of
    case_ranks: every known target, outfit order), at each of `weights`, without scoring the catalogue: the
    mixture's probabilities sum to 1 over the real articles, so a case's log-probability is the log of its
    target's, (1 - w) P_pop(t) + w k(t) / n (k(t) of the history's n slots hold t). The same numbers as the model's ranking pass but for
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
    n = (history >= N_SPECIAL).sum(dim=1).double()[outfit]  # as HistoryPopularityModel's `seen` counts them
    worn = ((history[outfit] == target[:, None]) & (history[outfit] >= N_SPECIAL)).sum(dim=1).double()
    weight = torch.tensor(weights, dtype=torch.float64)[None, :] * (n > 0).double()[:, None]
    mixed = (1 - weight) * probs[target][:, None] + weight * (worn / n.clamp_min(1.0))[:, None]
    return mixed.log().numpy()
