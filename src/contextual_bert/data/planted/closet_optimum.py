"""The planted closets' exact optimum (closets.py's story), with and without the customer's history."""

from __future__ import annotations

import numpy as np
import torch

from contextual_bert.data.feature_spec import MASK_INDEX, N_SPECIAL, UNKNOWN_INDEX
from contextual_bert.data.planted.optimum import (
    OUTFIT_ROW,
    ContextPrior,
    _group_log_prior,
    _logsumexp,
    _vocab_rows,
    context_keys,
    elementary_symmetric_excluding,
)
from contextual_bert.errors import ContextualBertError


class ClosetOptimum(ContextPrior):
    """The exact P(masked article | other items[, context]) of planted closets (closets.py), as logits over the
    vocabulary: a mixture over the C customers (the latent; its prior per context combination: ContextPrior),
    each with its known closet (module docstring).

    item_type:      (n_items,) product type of each vocabulary index, -1 at the special indices
    item_log_fresh: (n_items,) log q(a | t(a)) (ignored at special indices)
    rewear:         (C, T) rho_ct
    entry_customer, entry_item, entry_kappa: (E,) the closets' (customer, vocabulary index, kappa_c(article)) of
                    the articles the vocabulary holds
    oov_share:      (C, T) Q_c[t], e_c's mass on type t's articles outside the vocabulary
    Memory is bounded by scoring at most about `chunk_cells` float64 numbers per step (rows at a time)."""

    # buffers (register_buffer), typed for mypy
    item_type: torch.Tensor
    real_index: torch.Tensor
    fresh: torch.Tensor
    rewear: torch.Tensor
    log_keep: torch.Tensor
    owner_start: torch.Tensor
    owner_customer: torch.Tensor
    owner_gain: torch.Tensor
    entry_customer: torch.Tensor
    entry_item: torch.Tensor
    entry_type: torch.Tensor
    entry_kappa: torch.Tensor
    oov_share: torch.Tensor

    def __init__(
        self,
        item_type,
        item_log_fresh,
        rewear,
        entry_customer,
        entry_item,
        entry_kappa,
        oov_share,
        log_prior,
        context_digits=None,
        radix=None,
        keys=None,
        chunk_cells: int = 1 << 23,
    ):
        super().__init__()
        item_type = torch.as_tensor(item_type, dtype=torch.int64)
        real = item_type >= 0
        fresh = torch.as_tensor(item_log_fresh, dtype=torch.float64).exp() * real
        rewear = torch.as_tensor(rewear, dtype=torch.float64)
        entry_customer = torch.as_tensor(entry_customer, dtype=torch.int64)
        entry_item = torch.as_tensor(entry_item, dtype=torch.int64)
        entry_kappa = torch.as_tensor(entry_kappa, dtype=torch.float64)
        entry_type = item_type[entry_item]
        rho = rewear[entry_customer, entry_type]
        # a known item b's factor e_c(b) / q(b) = (1 - rho_ct) (1 + rho_ct kappa_c(b) / ((1 - rho_ct) q(b))): the
        # first per type (log_keep), the second, the gain, only where b is in c's closet; owners of an index i are
        # entries owner_start[i]:owner_start[i + 1] (sorted by index)
        order = torch.argsort(entry_item, stable=True)
        self.register_buffer("item_type", item_type)
        self.register_buffer("real_index", real.nonzero()[:, 0])
        self.register_buffer("fresh", fresh)
        self.register_buffer("rewear", rewear)
        self.register_buffer("log_keep", torch.log1p(-rewear).T.contiguous())  # (T, C)
        self.register_buffer("owner_start", torch.searchsorted(entry_item[order], torch.arange(len(item_type) + 1)))
        self.register_buffer("owner_customer", entry_customer[order])
        self.register_buffer("owner_gain", torch.log1p(rho * entry_kappa / ((1 - rho) * fresh[entry_item]))[order])
        self.register_buffer("entry_customer", entry_customer)
        self.register_buffer("entry_item", entry_item)
        self.register_buffer("entry_type", entry_type)
        self.register_buffer("entry_kappa", entry_kappa)
        self.register_buffer("oov_share", torch.as_tensor(oov_share, dtype=torch.float64))
        self._init_prior(log_prior, context_digits, radix, keys)
        self.n_items, self.n_customers, self.n_types = len(item_type), rewear.shape[0], rewear.shape[1]
        self.chunk_cells = chunk_cells

    def masked_logits(self, items: torch.Tensor, context=None) -> torch.Tensor:
        if not bool(((items == MASK_INDEX).sum(1) == 1).all()):
            raise ContextualBertError("the optimum scores outfits with exactly one [MASK] item each")
        context = context or {}
        degree = int((items == UNKNOWN_INDEX).sum(1).max()) if len(items) else 0
        per_row = self.n_customers * self.n_types * (degree + 3) + len(self.entry_item) + 3 * self.n_items
        step = max(1, self.chunk_cells // per_row)
        with torch.autocast(items.device.type, enabled=False):
            parts = [
                self._masked_logits(items[s : s + step], {k: v[s : s + step] for k, v in context.items()})
                for s in range(0, len(items), step)
            ]
        return torch.cat(parts) if parts else items.new_zeros(0, self.n_items, dtype=torch.float64)

    def _masked_logits(self, items: torch.Tensor, context: dict) -> torch.Tensor:
        batch = items.shape[0]
        known = items >= N_SPECIAL
        case, flat = known.nonzero(as_tuple=True)[0], items[known]
        taken = torch.zeros(batch, self.n_types, dtype=torch.bool, device=items.device)
        taken[case, self.item_type[flat]] = True
        # log P(c | context) + sum over the known items of log e_c(b) / q(b) (q(b) is the same for every c)
        log_post = self._log_prior(context, batch) + taken.to(torch.float64) @ self.log_keep
        counts = self.owner_start[flat + 1] - self.owner_start[flat]
        if int(counts.sum()) > 0:
            first = torch.repeat_interleave(self.owner_start[flat], counts)
            within = torch.arange(len(first), device=items.device) - torch.repeat_interleave(
                torch.cumsum(counts, 0) - counts, counts
            )
            owner = first + within
            log_post = log_post.index_put(
                (torch.repeat_interleave(case, counts), self.owner_customer[owner]),
                self.owner_gain[owner],
                accumulate=True,
            )
        post = torch.softmax(log_post, dim=1)  # P(c | known items, context), (B, C)
        # only the customers some case gives a probability above 0 add to a score (with context: its group's)
        active = (post > 0).any(0)
        post, rewear, oov_share = post[:, active], self.rewear[active], self.oov_share[active]
        entries = active[self.entry_customer]
        entry_customer = (torch.cumsum(active, 0) - 1)[self.entry_customer[entries]]
        free = (~taken).to(torch.float64)
        weight = post[:, :, None] * free[:, None, :]  # (B, C, T): the customer x type factor of a candidate
        n_unknown = (items == UNKNOWN_INDEX).sum(1)
        if int(n_unknown.max()) > 0:  # m items outside the vocabulary: e_m of Q_c over the other free types
            poly = elementary_symmetric_excluding(oov_share[None] * free[:, None, :], int(n_unknown.max()))
            degree = n_unknown.view(batch, 1, 1, 1).expand(-1, post.shape[1], self.n_types, 1)
            weight = weight * poly.gather(-1, degree)[..., 0]
        # score(a) = sum_c weight[c, t(a)] e_c(a) = q(a) sum_c weight (1 - rho_ct) + sum_c weight rho_ct kappa_c(a)
        fresh_mass = (weight * (1 - rewear)).sum(1)  # (B, T)
        score = torch.zeros(batch, self.n_items, dtype=torch.float64, device=items.device)
        score[:, self.real_index] = fresh_mass[:, self.item_type[self.real_index]] * self.fresh[self.real_index]
        closet = (weight * rewear)[:, entry_customer, self.entry_type[entries]] * self.entry_kappa[entries]
        score.index_add_(1, self.entry_item[entries], closet)
        total = score[:, N_SPECIAL:].sum(1, keepdim=True)
        logits = torch.log(score) - torch.log(total)
        logits[:, :N_SPECIAL] = float("-inf")
        return logits


class ClosetHistoryOptimum(ClosetOptimum):
    """ClosetOptimum whose prior is each outfit's own P(c | H, x): `log_prior` (W, C) for the W outfits that have
    one, `row_index` (N,) an outfit row's row of it, read at the row the cases' context gives under OUTFIT_ROW."""

    # buffers (register_buffer), typed for mypy
    row_index: torch.Tensor

    def __init__(self, *args, row_index, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("row_index", torch.as_tensor(row_index, dtype=torch.int64))

    def _log_prior(self, context, batch: int) -> torch.Tensor:
        return self.log_prior[self.row_index[context[OUTFIT_ROW]]]


def _closet_gains(truth) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The closets' entries (customer, article row, kappa) and each one's gain log(1 + rho_ct kappa / ((1 - rho_ct)
    q(article))): a known item's log e_c(b) is log q(b) + log(1 - rho_ct) + (its gain where b is in c's closet)."""
    customer, article, kappa = truth.closet_entries()
    rho = truth.rewear_by_type()[customer, truth.article_type[article]]
    return customer, article, kappa, np.log1p(rho * kappa / ((1 - rho) * np.exp(truth.log_fresh_share()[article])))


def build_closet_optimum(truth, vocab_ids, with_context: bool, customer_digits=None, context_digits=None,
                         radix=None) -> ClosetOptimum:  # fmt: skip
    """The closets' optimum over a vocabulary (build_optimum's arguments; `truth` a closets.ClosetTruth)."""
    rows = _vocab_rows(truth, vocab_ids)
    log_fresh = truth.log_fresh_share()
    item_type = np.concatenate([np.full(N_SPECIAL, -1), truth.article_type[rows]])
    item_log_fresh = np.concatenate([np.zeros(N_SPECIAL), log_fresh[rows]])
    rewear = truth.rewear_by_type()
    index_of_row = np.full(len(truth.article_ids), -1)
    index_of_row[rows] = N_SPECIAL + np.arange(len(rows))
    customer, article, kappa = truth.closet_entries()
    inside = index_of_row[article] >= 0
    # Q_c[t] = (1 - rho_ct) (q's mass outside the vocabulary) + rho_ct (kappa's mass outside it)
    outside = index_of_row < 0
    oov_fresh = np.bincount(truth.article_type[outside], weights=np.exp(log_fresh[outside]), minlength=truth.n_types)
    oov_closet = np.zeros_like(rewear)
    np.add.at(oov_closet, (customer[~inside], truth.article_type[article[~inside]]), kappa[~inside])
    oov = (1 - rewear) * oov_fresh[None, :] + rewear * oov_closet
    entries = (customer[inside], index_of_row[article[inside]], kappa[inside])
    if not with_context:
        return ClosetOptimum(
            item_type,
            item_log_fresh,
            rewear,
            *entries,
            oov,
            np.full((1, truth.n_customers), -np.log(truth.n_customers)),
        )
    log_prior, keys = _group_log_prior(context_keys(customer_digits, radix))
    return ClosetOptimum(item_type, item_log_fresh, rewear, *entries, oov, log_prior, context_digits, radix, keys)


def closet_history_log_prior(
    truth,
    customer_keys: np.ndarray,
    customer_rows: np.ndarray,
    article_rows: list[np.ndarray],
    history: list[np.ndarray],
    wanted: np.ndarray,
) -> np.ndarray:
    """(len(wanted), C) log P(c | H(o), x_o) for the outfits `wanted` (rows of the lists below):

        log P(c | H, x) = log P(c | x) + sum over h in H, b in h of log e_c(b) + const

    P(c | x) uniform over the customers whose context key (customer_keys, per truth customer) is the outfit's
    customer's. customer_rows: per outfit, its customer's row in the truth; article_rows: per outfit, its articles'
    rows in the truth; history: per outfit, the rows of its history (history.earlier_outfits)."""
    wanted = np.asarray(wanted, dtype=np.int64)
    n_c, n_t = truth.n_customers, truth.n_types
    members = [history[o] for o in wanted]
    owner = np.repeat(np.arange(len(wanted)), [len(m) for m in members])
    outfits = np.concatenate(members + [np.zeros(0, np.int64)]).astype(np.int64)  # the history's, in order
    lengths = np.array([len(article_rows[h]) for h in outfits], dtype=np.int64)
    article = np.concatenate([article_rows[h] for h in outfits] + [np.zeros(0, np.int64)]).astype(np.int64)
    owner = np.repeat(owner, lengths)
    # the (1 - rho_ct) factors, by the history's items per type
    per_type = np.bincount(owner * n_t + truth.article_type[article], minlength=len(wanted) * n_t)
    log_post = per_type.reshape(len(wanted), n_t).astype(np.float64) @ np.log1p(-truth.rewear_by_type()).T
    # the gains of the items in a customer's closet
    customer, entry_article, _, gain = _closet_gains(truth)
    order = np.argsort(entry_article, kind="stable")
    start = np.searchsorted(entry_article[order], np.arange(len(truth.article_ids) + 1))
    counts = start[article + 1] - start[article]
    first = np.repeat(start[article], counts)
    entry = order[first + np.arange(len(first)) - np.repeat(np.cumsum(counts) - counts, counts)]
    log_post += np.bincount(
        np.repeat(owner, counts) * n_c + customer[entry], weights=gain[entry], minlength=len(wanted) * n_c
    ).reshape(len(wanted), n_c)
    key = customer_keys[customer_rows[wanted]]
    group = customer_keys[None, :] == key[:, None]
    log_post = np.where(group, log_post - np.log(group.sum(1, keepdims=True)), -np.inf)
    return log_post - _logsumexp(log_post, 1)[:, None]
