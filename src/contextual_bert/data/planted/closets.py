"""Planted closets: real personalised outfits' shape (a large catalogue, each article seen once or twice, customers
who wear their own clothes again), from a story whose Bayes-optimal predictor is exact (optimum.py).

`planted.closet_size > 0` switches the planted source to this story (`data/sources/planted.py` picks it); 0, the
default, leaves today's planted data byte for byte. Its tastes are not used: the only latent is the customer.

The story (numpy; one `numpy.random.Generator` seeded `planted.seed` for all but the dates):

Catalogue. A articles (planted.n_articles) with one categorical attribute, the product type t(a) (T =
planted.n_types; every type gets an article; the articles table's brand, colour, style and price are null), and a
Zipf-like popularity pop[a] = (rank + 1) ** -popularity_exponent (ranks a random permutation). A fresh draw of type
t is article a with q(a | t) = pop[a] / sum of pop over the type's articles.

Customers. C customers (planted.n_customers), each with the context columns CLOSET_CONTEXT_COLUMNS (few values,
so a context is shared by many customers: the customer id is not a context feature and no column names a
customer), and a closet: M = planted.closet_size slots, each an article drawn by popularity (pop[a] / sum pop,
independently; an article in two slots counts twice). No column reveals the closet. n[c, t] is the number of c's
slots of type t.

Outfits. N outfits (planted.n_outfits), each independently:
1. its customer c uniform over the C customers;
2. a size n uniform in min_set_size..max_set_size, and n DISTINCT product types, uniform without replacement;
3. per chosen type t: where n[c, t] > 0, with the re-wear probability rho (planted.rewear_probability) one of c's
   slots of type t, uniformly (a re-wear); otherwise a fresh draw from q(. | t);
4. the items in a random order; a date uniform over planted.DATE_SPAN_DAYS days (its own generator, as planted's).

So, given its customer, an outfit's items are independent given their types, item b of type t with

    e_c(b) = (1 - rho_ct) q(b | t) + rho_ct kappa_c(b),   rho_ct = rho 1[n[c, t] > 0],
    kappa_c(b) = (c's slots holding b) / n[c, t]

(sum over the type's articles: 1). The optimum is this story's posterior with the closets as known parameters and
the customer as the latent: a mixture over the C customers, each with its known closet (optimum.py).

Files: the raw contract (planted's `write_raw`: the tables, schema.json, ingest_report.json) and the truth,
ClosetTruth, in planted.TRUTH_FILE / TRUTH_JSON.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from contextual_bert.config import PlantedConfig
from contextual_bert.data.contract import ContextColumn, DataSchema
from contextual_bert.data.planted import tastes

# (column, number of values): the customers' context, of few combinations (24): it narrows the customer down to a
# group, never to one customer
CLOSET_CONTEXT_COLUMNS: tuple[tuple[str, int], ...] = (("region", 6), ("age_group", 4))
CLOSET_KEY = "closet"  # the truth file holds this array: a closets truth (planted_source.load_truth tells them apart)


@dataclass(frozen=True)
class ClosetTruth:
    """What the closets' optimum needs, in the raw tables' rows."""

    article_ids: np.ndarray  # (A,) str
    article_type: np.ndarray  # (A,) int, 0..n_types-1
    log_popularity: np.ndarray  # (A,) log pop[a]
    customer_ids: np.ndarray  # (C,) str
    closet: np.ndarray  # (C, M) int: the article row of each slot of each customer's closet
    rewear: float  # rho
    n_types: int

    @property
    def n_customers(self) -> int:
        return len(self.customer_ids)

    def log_fresh_share(self) -> np.ndarray:
        """(A,) log q(a | t(a))."""
        top = self.log_popularity.max()
        per_type = np.bincount(self.article_type, weights=np.exp(self.log_popularity - top), minlength=self.n_types)
        return self.log_popularity - top - np.log(per_type[self.article_type])

    def slots_by_type(self) -> np.ndarray:
        """(C, T) n[c, t]: the closet's slots of each type."""
        c = np.repeat(np.arange(self.n_customers), self.closet.shape[1])
        return np.bincount(
            c * self.n_types + self.article_type[self.closet.ravel()], minlength=self.n_customers * self.n_types
        ).reshape(self.n_customers, self.n_types)

    def rewear_by_type(self) -> np.ndarray:
        """(C, T) rho_ct = rho 1[n[c, t] > 0]."""
        return self.rewear * (self.slots_by_type() > 0)

    def closet_entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(customer, article row, kappa_c(article)) for each distinct (customer, article) of the closets."""
        c = np.repeat(np.arange(self.n_customers), self.closet.shape[1])
        pairs, count = np.unique(np.stack([c, self.closet.ravel()], 1), axis=0, return_counts=True)
        customer, article = pairs[:, 0], pairs[:, 1]
        return customer, article, count / self.slots_by_type()[customer, self.article_type[article]]

    def emission(self) -> np.ndarray:
        """(C, A) e_c(a), dense: for small truths (tests)."""
        rho = self.rewear_by_type()[:, self.article_type]
        out = (1 - rho) * np.exp(self.log_fresh_share())[None, :]
        customer, article, kappa = self.closet_entries()
        out[customer, article] += rho[customer, article] * kappa
        return out

    def save(self, out_dir: Path, about: dict) -> None:
        # allow_pickle: numpy's default, named so that the arrays passed by name cannot be taken for it
        np.savez_compressed(Path(out_dir) / tastes.TRUTH_FILE, article_ids=self.article_ids.astype(str),
                            article_type=self.article_type, log_popularity=self.log_popularity,
                            customer_ids=self.customer_ids.astype(str), **{CLOSET_KEY: self.closet},
                            rewear=np.float64(self.rewear), n_types=np.int64(self.n_types),
                            allow_pickle=True)  # fmt: skip
        (Path(out_dir) / tastes.TRUTH_JSON).write_text(json.dumps(about, indent=2))

    @classmethod
    def from_npz(cls, z) -> ClosetTruth:
        return cls(
            article_ids=z["article_ids"],
            article_type=z["article_type"].astype(np.int64),
            log_popularity=z["log_popularity"].astype(np.float64),
            customer_ids=z["customer_ids"],
            closet=z[CLOSET_KEY].astype(np.int64),
            rewear=float(z["rewear"]),
            n_types=int(z["n_types"]),
        )


def truth_from_npz(z, path: Path) -> ClosetTruth:
    truth = ClosetTruth.from_npz(z)
    if truth.closet.shape[0] != len(truth.customer_ids) or (truth.closet >= len(truth.article_ids)).any():
        raise ValueError("its closets name customers or articles it lacks")
    return truth


def closet_schema() -> DataSchema:
    return DataSchema(source=tastes.SOURCE, context_columns=tuple(
        ContextColumn(name, "customers", "categorical", nullable=False, values=tuple(tastes._names(name, k)))
        for name, k in CLOSET_CONTEXT_COLUMNS))  # fmt: skip


# --- the story ---------------------------------------------------------------------------------------


def _fresh(
    rng: np.random.Generator, article_type: np.ndarray, popularity: np.ndarray, types: np.ndarray, n_types: int
) -> np.ndarray:
    """One draw from q(. | t) per entry of `types` (inverse CDF over the articles sorted by type)."""
    by_type = np.argsort(article_type, kind="stable")
    cum = np.cumsum(popularity[by_type])
    end = np.searchsorted(article_type[by_type], np.arange(n_types), side="right")
    start = np.concatenate([[0], end[:-1]])
    low = np.where(start > 0, cum[start - 1], 0.0)
    u = low[types] + rng.random(len(types)) * (cum[end - 1] - low)[types]
    pos = np.clip(np.searchsorted(cum, u, side="right"), start[types], end[types] - 1)
    return by_type[pos]


def _story(cfg: PlantedConfig, max_set_size: int, min_set_size: int) -> dict:
    rng = np.random.default_rng(cfg.seed)
    a, t, c, n = cfg.n_articles, cfg.n_types, cfg.n_customers, cfg.n_outfits
    article_type = np.concatenate([np.arange(t), rng.integers(0, t, a - t)])
    rng.shuffle(article_type)
    popularity = (rng.permutation(a) + 1.0) ** -cfg.popularity_exponent
    values = {}
    for name, n_values in CLOSET_CONTEXT_COLUMNS:
        values[name] = rng.choice(n_values, c, p=rng.dirichlet(np.full(n_values, tastes.VALUE_ODDS_CONCENTRATION)))
    closet = rng.choice(a, (c, cfg.closet_size), p=popularity / popularity.sum())

    customer = rng.integers(0, c, n)
    size = rng.integers(min_set_size, max_set_size + 1, n)
    types = np.argsort(rng.random((n, t)), axis=1)[:, :max_set_size]
    keep = np.arange(max_set_size)[None, :] < size[:, None]
    draw_outfit = np.broadcast_to(np.arange(n)[:, None], types.shape)[keep]
    draw_type = types[keep]
    draw_customer = customer[draw_outfit]
    # the closets' slots grouped by (customer, type): slot_of[key_start[k] : key_start[k] + n_slots[k]]
    slot_key = np.repeat(np.arange(c), cfg.closet_size) * t + article_type[closet.ravel()]
    slot_of = closet.ravel()[np.argsort(slot_key, kind="stable")]
    n_slots = np.bincount(slot_key, minlength=c * t)
    key_start = np.concatenate([[0], np.cumsum(n_slots)[:-1]])
    key = draw_customer * t + draw_type
    rewear = (n_slots[key] > 0) & (rng.random(len(key)) < cfg.rewear_probability)
    pick = rng.random(len(key))
    article = _fresh(rng, article_type, popularity, draw_type, t)
    slot = key_start[key] + np.minimum((pick * n_slots[key]).astype(np.int64), np.maximum(n_slots[key] - 1, 0))
    article[rewear] = slot_of[slot[rewear]]
    order = np.lexsort((rng.random(len(draw_outfit)), draw_outfit))  # grouped by outfit, items shuffled
    return dict(article_type=article_type, popularity=popularity, values=values, closet=closet, customer=customer,
                size=size, draw_outfit=draw_outfit[order], article=article[order], rewear=rewear[order],
                date=tastes.outfit_dates(cfg.seed, n))  # fmt: skip


def generate_closets(cfg: PlantedConfig, out_dir: Path, max_set_size: int, min_set_size: int) -> dict:
    """Write the raw contract and the ClosetTruth into out_dir (planted_source.generate with closet_size > 0)."""
    tastes.check_sizes(cfg, max_set_size)
    started = time.perf_counter()
    s = _story(cfg, max_set_size, min_set_size)
    article_id, customer_id = tastes._names("P", cfg.n_articles), tastes._names("PC", cfg.n_customers)
    none = pa.nulls(cfg.n_articles, pa.string())
    tables = {
        "articles": pa.table({
            "article_id": pa.array(article_id, pa.string()),
            "product_type": pa.array(tastes._names("type", cfg.n_types)[s["article_type"]], pa.string()),
            "brand": none, "color": none, "style": none, "price": pa.nulls(cfg.n_articles, pa.float64())}),
        "customers": pa.table({
            "customer_id": pa.array(customer_id, pa.string()),
            **{name: pa.array(tastes._names(name, k)[s["values"][name]], pa.string())
               for name, k in CLOSET_CONTEXT_COLUMNS}}),
        "outfits": tastes.outfits_table(customer_id[s["customer"]], article_id[s["article"]], s["size"], s["date"]),
    }  # fmt: skip
    truth = ClosetTruth(article_ids=article_id.astype(str), article_type=s["article_type"],
                        log_popularity=np.log(s["popularity"]), customer_ids=customer_id.astype(str),
                        closet=s["closet"], rewear=cfg.rewear_probability, n_types=cfg.n_types)  # fmt: skip
    sightings = np.bincount(s["article"], minlength=cfg.n_articles)
    drawn = sightings[sightings > 0]
    outfits_per_customer = np.bincount(s["customer"], minlength=cfg.n_customers)
    signal = {
        "items_rewear_share": round(float(s["rewear"].mean()), 4),  # items drawn from their customer's closet
        "types_in_closet_share": round(float((truth.slots_by_type() > 0).mean()), 4),
        "sightings_per_drawn_article": round(float(drawn.mean()), 3),
        "drawn_articles_seen_once": round(float((drawn == 1).mean()), 4),
        "drawn_articles_seen_at_most_twice": round(float((drawn <= 2).mean()), 4),
        "outfits_per_customer": round(float(outfits_per_customer.mean()), 2),
    }
    about = {
        "story": "see the docstring of contextual_bert/data/closets.py",
        "params": cfg.model_dump(
            include={
                "seed",
                "n_outfits",
                "n_articles",
                "n_customers",
                "n_types",
                "popularity_exponent",
                "closet_size",
                "rewear_probability",
            }
        ),
        "context_columns": [{"name": n, "n_values": k} for n, k in CLOSET_CONTEXT_COLUMNS],
        "signal": signal,
    }
    report = {
        "source": tastes.SOURCE,
        "story": "closets",
        "seed": cfg.seed,
        "size": {
            "n_outfits": cfg.n_outfits,
            "n_articles": cfg.n_articles,
            "n_customers": cfg.n_customers,
            "closet_size": cfg.closet_size,
        },
        "rows": {name: table.num_rows for name, table in tables.items()},
        "items_per_outfit": round(float(s["size"].mean()), 3),
        "articles_never_drawn": int(cfg.n_articles - len(drawn)),
        "planted_signal": signal,
    }
    tastes.write_raw(Path(out_dir), tables, closet_schema(), truth, about, report)
    return {**report, "seconds": round(time.perf_counter() - started, 2)}
