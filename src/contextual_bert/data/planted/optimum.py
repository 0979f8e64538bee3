"""The Bayes-optimal masked-item predictor of planted data (`tastes.py`, `closets.py`), scored like any model.

`BayesOptimum.masked_logits(items, context) -> (B, n_items)` works in the features stage's index space, so
`ranking.case_ranks` / `evaluation.evaluate_model` rank it on the same test cases, with the same metrics and JSON, as
the popularity yardstick and the trained models. Its probabilities are exact for what a model sees:

- the candidates are the vocabulary's articles (the evaluation skips [UNK] targets, so the target is known
  to be in the vocabulary): P(a | O, x) is renormalised over them;
- an item of the outfit that is [UNK] (an article the vocabulary lacks) is an observation too: its type is
  one of the types not otherwise in the outfit and its article one outside the vocabulary. With m such
  items and Q[t, z] = sum over out-of-vocabulary articles b of type t of w[b, z] / W[t, z], the taste and
  type terms gain the factor e_m({Q[r, z] : r not in types(O), r != t(a)}) (e_m: the elementary symmetric
  polynomial; the m unknown items take m distinct remaining types, every type set equally likely). With no
  [UNK] item (m = 0) this is 1 and the formula is planted.py's;
- with context, P(z | context) is the mean of P(z | x_c) over the population's customers whose context
  encodes to the same indices (a customer is drawn uniformly, so this is exact even where two raw values
  share an index, e.g. [UNK]); without context, the mean over all customers.

So for a case with other items O (m of them [UNK]) and candidate a of type t(a) not in types(O):

    score(a) = sum_z P(z | x) * prod_{b in O known} S[b, z] * e_m(Q[. , z] minus types(O), t(a)) * S[a, z]

with S[a, z] = w[a, z] / W[t(a), z]; log P(a | O, x) = log score(a) - log sum over vocabulary of score.
In float64, with autocast off, on any device. Types of O get probability exactly 0 (log -inf).

With context and history ("optimum_history"; only where the truth has the hidden per-customer taste,
planted.customer_taste_strength > 0, else the row is absent: its file says {"known": false, "why": ...}).
An outfit's history H is its customer's earlier outfits (history.earlier_outfits: strictly earlier dates,
among the eligible outfits: every outfit of the features stage under features.split time, the train
outfits under hash), each read as its raw articles (the truth's rows, vocabulary or not: a bound for any
model reading the history). With L_h(z) = prod_{b in h} S[b, z] and u the customer's hidden taste (uniform):

    log P(u | H, x) = sum_{h in H} logsumexp_z( log P(z | x, u) + log L_h(z) ) + const
    P(z | H, x)     = sum_u P(u | H, x) P(z | x, u)

and the case is scored as above with P(z | H, x) as its prior (summing u out of P(u, z | O, H, x) first
gives the same posterior over z). With an empty history P(z | H, x) = P(z | x): the row "with context".

The planted tastes' options (tastes_options.py). With the compatibility switch the latent is the pair (lifestyle,
taste) and the truth's arrays are over it (P(v, z | x_c) = 1[v = v_c] P(z | x_c), S_v[a, z]), so every formula
above holds with z read as the pair: with context the lifestyle column is one of the context's digits, and a
context combination's prior puts its mass on its customers' lifestyles; without it the prior is the population's
mean, which sums the lifestyle out. A prior entry may be exactly 0 (log -inf): that pair has no mass. The paper's
noise columns (truth.ignored_context) are not among the context digits (evaluation/optimum.py leaves them out):
independent of every latent, they would change no prior.

Planted closets (closets.py; ClosetOptimum, the same three rows). The latent is the customer c, uniform over the
C customers (with context: over those whose context encodes to the case's), each with its known closet; given c an
outfit's items are independent given their types, item b with e_c(b) = (1 - rho_ct) q(b | t) + rho_ct kappa_c(b).
The same formula as above with the customers in place of the tastes and e_c in place of S:

    score(a) = sum_c P(c | x) * prod_{b in O known} e_c(b) * e_m(Q_c[.] minus types(O), t(a)) * e_c(a)

Q_c[t] = (1 - rho_ct) (q's mass of type t outside the vocabulary) + rho_ct (kappa_c's mass there). e_c is a type
term plus a sparse closet term, so nothing (articles x customers) is ever dense: a known item's log e_c(b) is log q(b)
(the same for every c, dropped) + log(1 - rho_ct) + log(1 + rho_ct kappa_c(b) / ((1 - rho_ct) q(b))) where b is in
c's closet, and score(a) = q(a) sum_c w_c (1 - rho_ct(a)) + sum_c w_c rho_ct(a) kappa_c(a). With the history H:

    log P(c | H, x) = log P(c | x) + sum_{h in H} sum_{b in h} log e_c(b) + const

(closet_history_log_prior; H's raw articles, as above), the case scored with it as its prior.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import nn

from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, UNKNOWN_INDEX
from contextual_bert.data.planted.tastes import PlantedTruth
from contextual_bert.errors import ContextualBertError, DataError

OUTFIT_ROW = "__outfit_row__"  # a context entry of the history optimum's cases: the case's outfit (its prior)


def elementary_symmetric_excluding(values: torch.Tensor, degree: int) -> torch.Tensor:
    """(..., T, degree + 1): entry [..., t, j] = e_j(values[..., r] for r != t), the elementary symmetric
    polynomial of degree j of all values but the t-th. From prefix and suffix polynomials, so no
    subtraction (no cancellation)."""
    *lead, t = values.shape
    ones = values.new_zeros(*lead, degree + 1)
    ones[..., 0] = 1.0
    prefix, suffix = [ones], [ones]
    for r in range(t):  # prefix[r] = e(values[:r]); suffix[r] = e(values[t - r:])
        for polys, v in ((prefix, values[..., r]), (suffix, values[..., t - 1 - r])):
            last = polys[-1]
            grown = last.clone()
            grown[..., 1:] += v[..., None] * last[..., :-1]
            polys.append(grown)
    before = torch.stack(prefix[:t], dim=-2)  # e(values[:t])
    after = torch.stack(suffix[:t][::-1], dim=-2)  # e(values[t + 1:])
    out = values.new_zeros(*lead, t, degree + 1)
    for j in range(degree + 1):
        out[..., j] = (before[..., : j + 1] * after[..., : j + 1].flip(-1)).sum(-1)
    return out


class ContextPrior(nn.Module):
    """A latent's prior per context combination: `log_prior` (P, L) over L latent values (tastes, customers), read at
    the row of the case's context (context_digits: [(feature name, width)] in key order, `radix` (D,) the
    cardinality of each digit, `keys` (P,) the sorted mixed-radix key of each combination); P = 1 and
    context_digits None: one prior for every case (without context)."""

    # buffers (register_buffer), typed for mypy
    log_prior: torch.Tensor
    multiplier: torch.Tensor
    keys: torch.Tensor

    def _init_prior(self, log_prior, context_digits=None, radix=None, keys=None) -> None:
        self.register_buffer("log_prior", torch.as_tensor(log_prior, dtype=torch.float64))
        self.context_digits = list(context_digits or [])
        if self.context_digits:
            radix = torch.as_tensor(radix, dtype=torch.int64)
            self.register_buffer("multiplier", torch.cumprod(torch.cat([radix.new_ones(1), radix[:-1]]), 0))
            self.register_buffer("keys", torch.as_tensor(keys, dtype=torch.int64))

    def context_key(self, context: dict) -> torch.Tensor:
        digits = torch.cat([context[name].reshape(len(context[name]), -1)[:, :w] for name, w in self.context_digits],
                           dim=1)  # fmt: skip
        return (digits * self.multiplier).sum(1)

    def _log_prior(self, context, batch: int) -> torch.Tensor:
        if not self.context_digits:
            return self.log_prior.expand(batch, -1)
        key = self.context_key(context)
        pos = torch.searchsorted(self.keys, key).clamp(max=len(self.keys) - 1)
        if not bool((self.keys[pos] == key).all()):
            raise ContextualBertError(
                "a context combination absent from the planted customer population: "
                "the data and its truth file disagree"
            )
        return self.log_prior[pos]


class BayesOptimum(ContextPrior):
    """The exact P(masked article | other items[, context]) of planted data, as logits over the vocabulary.

    item_type:      (n_items,) product type of each vocabulary index, -1 at the special indices
    item_log_share: (n_items, K) log S[a, z] = log w[a, z] / W[t(a), z] (ignored at special indices)
    oov_share:      (T, K) Q[t, z], the share of type t's weight under taste z outside the vocabulary
    log_prior:      (P, K) log P(z | context combination p); P = 1 and context_digits None without context
    context_digits: [(feature name, width)] in key order, with `radix` (D,) the cardinality of each digit and
                    `keys` (P,) the sorted mixed-radix key of each combination
    """

    # buffers (register_buffer), typed for mypy
    sorted_index: torch.Tensor
    sorted_share: torch.Tensor
    item_type: torch.Tensor
    item_log_share: torch.Tensor
    oov_share: torch.Tensor

    def __init__(self, item_type, item_log_share, oov_share, log_prior, context_digits=None, radix=None,
                 keys=None):  # fmt: skip
        super().__init__()
        item_type = torch.as_tensor(item_type, dtype=torch.int64)
        share = torch.as_tensor(item_log_share, dtype=torch.float64).exp()
        n_items, k = share.shape
        t = int(oov_share.shape[0])
        real = item_type >= 0
        share[~real] = 0.0
        # The vocabulary's articles sorted by type: type t's articles are columns bounds[t]:bounds[t + 1] of
        # `sorted_share` (K, A), so a candidate's score is one (B, K) @ (K, A_t) product per type.
        order = torch.argsort(torch.where(real, item_type, t), stable=True)[: int(real.sum())]
        self.bounds = torch.searchsorted(item_type[order], torch.arange(t + 1)).tolist()
        self.register_buffer("sorted_index", order)
        self.register_buffer("sorted_share", share[order].T.contiguous())
        self.register_buffer("item_type", item_type)
        self.register_buffer("item_log_share", torch.log(share))  # -inf at special indices, never read
        self.register_buffer("oov_share", torch.as_tensor(oov_share, dtype=torch.float64))
        self._init_prior(log_prior, context_digits, radix, keys)
        self.n_items, self.n_tastes, self.n_types = n_items, k, t

    def masked_logits(self, items: torch.Tensor, context=None) -> torch.Tensor:
        with torch.autocast(items.device.type, enabled=False):
            return self._masked_logits(items, context or {})

    def _masked_logits(self, items: torch.Tensor, context: dict) -> torch.Tensor:
        batch = items.shape[0]
        if not bool(((items == MASK_INDEX).sum(1) == 1).all()):
            raise ContextualBertError("the optimum scores outfits with exactly one [MASK] item each")
        known = items >= N_SPECIAL
        safe = torch.where(known, items, torch.zeros_like(items))
        log_post = self._log_prior(context, batch) + torch.where(
            known[..., None], self.item_log_share[safe], torch.zeros((), dtype=torch.float64, device=items.device)
        ).sum(1)
        post = torch.softmax(log_post, dim=1)  # P(z | known items, context), (B, K)
        taken = torch.zeros(batch, self.n_types, dtype=torch.bool, device=items.device)
        taken[known.nonzero(as_tuple=True)[0], self.item_type[items[known]]] = True
        free = (~taken).to(torch.float64)[:, None, :]  # (B, 1, T)
        n_unknown = (items == UNKNOWN_INDEX).sum(1)
        weight = post[:, :, None] * free  # (B, K, T): the taste x type factor of a candidate
        if int(n_unknown.max()) > 0:
            poly = elementary_symmetric_excluding(self.oov_share.T[None] * free, int(n_unknown.max()))
            degree = n_unknown.view(batch, 1, 1, 1).expand(-1, self.n_tastes, self.n_types, 1)
            weight = weight * poly.gather(-1, degree)[..., 0]
        score = torch.zeros(batch, self.n_items, dtype=torch.float64, device=items.device)
        sorted_score = torch.empty(batch, len(self.sorted_index), dtype=torch.float64, device=items.device)
        for ty in range(self.n_types):
            cols = slice(self.bounds[ty], self.bounds[ty + 1])
            sorted_score[:, cols] = weight[:, :, ty] @ self.sorted_share[:, cols]
        score[:, self.sorted_index] = sorted_score
        total = score[:, N_SPECIAL:].sum(1, keepdim=True)
        logits = torch.log(score) - torch.log(total)
        logits[:, :N_SPECIAL] = float("-inf")
        return logits


class HistoryOptimum(BayesOptimum):
    """BayesOptimum whose prior is each outfit's own P(z | H, x): `log_prior` (N, K) is read at the row the
    cases' context gives under OUTFIT_ROW."""

    def _log_prior(self, context, batch: int) -> torch.Tensor:
        return self.log_prior[context[OUTFIT_ROW]]


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # a slice all -inf (a lifestyle not the customer's) sums to log 0
        return np.log(np.exp(x - top).sum(axis=axis)) + np.squeeze(top, axis=axis)


def history_log_prior(
    truth: PlantedTruth,
    customer_rows: np.ndarray,
    article_rows: list[np.ndarray],
    history: list[np.ndarray],
    wanted: np.ndarray,
    chunk: int = 4096,
) -> np.ndarray:
    """(len(wanted), K) log P(z | H(o), x_o) for the outfits `wanted` (rows of the lists below).

    customer_rows: per outfit, its customer's row in the truth; article_rows: per outfit, its articles' rows in
    the truth; history: per outfit, the rows of its history (history.earlier_outfits)."""
    log_share = truth.log_type_share()  # (A, K) log S[b, z]
    log_z_given_u = truth.log_taste_given_u()  # (C, U, K)
    n_tastes_u = log_z_given_u.shape[1]
    wanted = np.asarray(wanted, dtype=np.int64)
    members = np.concatenate([history[o] for o in wanted] + [np.zeros(0, np.int64)]).astype(np.int64)
    owner = np.repeat(np.arange(len(wanted)), [len(history[o]) for o in wanted])
    # per history member h: m_h(u) = logsumexp_z(log P(z | x, u) + log L_h(z)), its customer's x (= the owner's)
    used, where = np.unique(members, return_inverse=True)
    lengths = np.array([len(article_rows[h]) for h in used], dtype=np.int64)
    flat = np.concatenate([article_rows[h] for h in used] + [np.zeros(0, np.int64)]).astype(np.int64)
    log_likelihood = np.add.reduceat(log_share[flat], np.r_[0, np.cumsum(lengths)[:-1]], axis=0) if len(used) \
        else np.zeros((0, truth.n_tastes))  # fmt: skip
    evidence = np.empty((len(used), n_tastes_u))
    for start in range(0, len(used), chunk):
        part = slice(start, start + chunk)
        evidence[part] = _logsumexp(log_z_given_u[customer_rows[used[part]]] + log_likelihood[part][:, None, :], -1)
    log_u = np.zeros((len(wanted), n_tastes_u))  # the uniform prior's constant drops out
    np.add.at(log_u, owner, evidence[where])
    log_u -= _logsumexp(log_u, -1)[:, None]
    out = np.empty((len(wanted), truth.n_tastes))
    for start in range(0, len(wanted), chunk):
        part = slice(start, start + chunk)
        out[part] = _logsumexp(log_u[part][:, :, None] + log_z_given_u[customer_rows[wanted[part]]], 1)
    return out


# --- building it from the truth -----------------------------------------------------------------------------


def _population_log_prior(taste_prob: np.ndarray, keys: np.ndarray | None):
    """(log prior per combination, sorted unique keys): the mean P(z | x_c) over each key's customers (with the
    compatibility switch an entry may be 0, its log -inf: a lifestyle none of the key's customers has)."""
    if keys is None:
        with np.errstate(divide="ignore"):
            return np.log(taste_prob.mean(axis=0, keepdims=True)), None
    unique, inverse = np.unique(keys, return_inverse=True)
    sums = np.zeros((len(unique), taste_prob.shape[1]))
    np.add.at(sums, inverse, taste_prob)
    with np.errstate(divide="ignore"):
        return np.log(sums / np.bincount(inverse)[:, None]), unique


def context_keys(customer_digits, radix) -> np.ndarray:
    """The mixed-radix key of each customer's encoded context (ContextPrior.context_key's, in numpy)."""
    radix = np.asarray(radix, dtype=np.int64)
    if np.sum(np.log2(radix.astype(np.float64))) >= 62:
        raise ContextualBertError("too many context combinations for one int64 key")
    return np.asarray(customer_digits) @ np.cumprod(np.concatenate([[1], radix[:-1]])).astype(np.int64)


def build_optimum(truth: PlantedTruth, vocab_ids, with_context: bool, customer_digits=None,
                  context_digits=None, radix=None) -> BayesOptimum:  # fmt: skip
    """The optimum over a vocabulary (`vocab_ids`: article id per index, specials first).

    customer_digits: (C, D) int64, the encoded context of the truth's customers, in its customer order, as
    the model sees it ([(name, width)] `context_digits`, each digit's cardinality in `radix`)."""
    rows = _vocab_rows(truth, vocab_ids)
    log_share = truth.log_type_share()
    item_type = np.concatenate([np.full(N_SPECIAL, -1), truth.article_type[rows]])
    item_log_share = np.concatenate([np.zeros((N_SPECIAL, truth.n_tastes)), log_share[rows]])
    outside = np.ones(len(truth.article_ids), dtype=bool)
    outside[rows] = False
    oov = np.zeros((truth.n_types, truth.n_tastes))
    np.add.at(oov, truth.article_type[outside], np.exp(log_share[outside]))
    if not with_context:
        log_prior, _ = _population_log_prior(truth.taste_prob, None)
        return BayesOptimum(item_type, item_log_share, oov, log_prior)
    log_prior, keys = _population_log_prior(truth.taste_prob, context_keys(customer_digits, radix))
    return BayesOptimum(item_type, item_log_share, oov, log_prior, context_digits, radix, keys)


# --- planted closets (closets.py): the customer is the latent ------------------------------------------


def _vocab_rows(truth, vocab_ids) -> np.ndarray:
    """The truth's row of each vocabulary article (specials excluded); one the truth lacks -> DataError."""
    vocab = pd.Index(list(vocab_ids[N_SPECIAL:]), dtype=object).astype(str)
    rows = pd.Index(truth.article_ids.astype(str)).get_indexer(vocab)
    if (rows < 0).any():
        missing = vocab_ids[N_SPECIAL + int(np.flatnonzero(rows < 0)[0])]
        raise DataError(
            f"article '{missing}' of the vocabulary is not in the planted truth; the data and its truth file disagree"
        )
    return rows


def _group_log_prior(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((P, C) log P(c | context combination p), the sorted unique keys): uniform over the customers whose
    context encodes to that key (a customer is drawn uniformly)."""
    unique, inverse = np.unique(keys, return_inverse=True)
    member = inverse[None, :] == np.arange(len(unique))[:, None]
    with np.errstate(divide="ignore"):
        return np.log(member / member.sum(1, keepdims=True)), unique
