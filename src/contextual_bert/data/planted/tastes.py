"""Planted data: outfits from a generative story whose Bayes-optimal masked-item predictor is exact.

The stylist generator (`data/sources/synthetic.py`) is realistic but its optimum cannot be computed. This one is simpler
on purpose: a latent taste z links the customer's context to the articles of an outfit, and every
probability in the story is known, so `optimum.py` can say how well any model could possibly do.

The story (numpy, one `numpy.random.Generator` seeded once: a seed fixes the data and the truth):

Catalogue. A articles, T product types (every type gets at least one article), S styles, colours and
brands. Each article a has a type t(a), a style s(a), a colour c(a), a Zipf-like popularity
pop[a] = (rank + 1) ** -popularity_exponent (ranks a random permutation), a brand and a price (brand and
price are noise: the optimum does not depend on them). K tastes; each style and each colour has an affinity
to each taste, drawn N(0, 1) once. An article's weight under taste z is

    w[a, z] = pop[a] * exp(taste_strength * (style_affinity[s(a), z] + 0.5 * color_affinity[c(a), z])
                           + hidden_taste_strength * hidden_affinity[h(a), z])

with h(a) a hidden style (one of N_STYLES, its own N(0, 1) affinity table) that no column of the articles
table carries: the tastes an article answers to are then known from the outfits it is in and from nothing
else (a model given the attribute columns cannot read them off). hidden_taste_strength 0 (the default) leaves
it out, and the data and the truth are byte for byte those without it: h and its table come from a
generator of their own (seeded [seed, 1]), not from the story's.

and W[t, z] = sum of w[b, z] over the articles b of type t.

Customers. C customers, each with a few categorical context columns (`CONTEXT_COLUMNS`): the informative
ones each own a table G_f[value, z] ~ N(0, context_strength^2); the noise ones have none. Values are drawn
independently per column (each column's value odds from a Dirichlet(4) draw). The customer's taste odds:

    P(z | x) = softmax_z( sum over informative columns f of G_f[x_f, z] )

A hidden taste per customer (customer_taste_strength s > 0): each customer c also has u_c, uniform over
0..U-1 (U = n_customer_tastes), that no column shows, and a table H[u, z] ~ N(0, 1) shifts its tastes:

    P(z | x, u) = softmax_z( sum over informative columns f of G_f[x_f, z] + s * H[u, z] )

so a customer's outfits share more than the context: what its earlier outfits show says which u is theirs.
u and H come from a generator of their own (seeded [seed, CUSTOMER_TASTE_STREAM]); s = 0 (the default) leaves
them out, and the data and the truth are byte for byte those without it (but for the dates below).

Outfits. N outfits, each independently:
1. its customer uniform over the C customers;
2. z ~ P(z | x_customer, u_customer), drawn per outfit (without the hidden taste nothing about a customer
   beyond its context is shared between its outfits);
3. a size n uniform in min_set_size..max_set_size (ingest.min_set_size, model.max_set_size);
4. n DISTINCT product types, uniform without replacement: no two articles of one type share an outfit;
5. per chosen type t, one article a with P(a | t, z) = w[a, z] / W[t, z];
6. the items in a random order (a position says nothing);
7. a date (contract.DATE_COLUMN), uniform over DATE_SPAN_DAYS days from DATE_START, from a generator of its
   own (seeded [seed, DATE_STREAM]): it orders a customer's outfits, and says nothing about them.

The optimum. For a masked position of an outfit of size n whose other items O are known:

    P(a | O, x) = sum_z P(z | O, x) * 1[t(a) not in types(O)] / (T - n + 1) * w[a, z] / W[t(a), z]
    P(z | O, x) proportional to P(z | x) * prod_{b in O} w[b, z] / W[t(b), z]

and without the context P(z | x) is replaced by the population marginal, the mean of P(z | x_c) over the
C customers. With the hidden taste, P(z | x) = mean over u of P(z | x, u) (u is uniform and unseen); the
truth's taste_prob is that marginal, so the two formulas above stay exact. Given also the customer's history
H (its earlier outfits, history.py), u is learnt from them:

    P(u | H, x) proportional to prod_{h in H} sum_z P(z | x, u) prod_{b in h} w[b, z] / W[t(b), z]
    P(z | O, H, x) proportional to sum_u P(u | H, x) P(z | x, u) prod_{b in O} w[b, z] / W[t(b), z]

and P(a | O, H, x) is the first formula with P(z | O, H, x) in place of P(z | O, x) (optimum.py, the row
"with context and history"). For that the truth also holds taste_logit (C, K), the context's logits, and
customer_taste_table (U, K), s * H: P(z | x_c, u) = softmax(taste_logit[c] + customer_taste_table[u]). `optimum.py` computes this over the features stage's vocabulary (and handles articles the
vocabulary lacks exactly); this module writes the data and the truth it needs.

Options (tastes_options.py, each off by default, and then the data is today's byte for byte): a compatibility
switch (a customer column that changes which styles go with a taste; the truth's latent is then the pair
(lifestyle, taste)), the paper's context (twelve customer columns of pure noise) and article vectors.

Planted closets (planted.closet_size > 0) are another story, with their own truth (closets.py);
data/sources/planted.py, the `planted` source, picks the story.

Files (the raw contract of `contract.py`, so validate / features / train run unchanged, plus the truth):
data/raw/{articles,customers,outfits}.parquet, schema.json (source "planted"), ingest_report.json, and
TRUTH_FILE (numpy arrays) with TRUTH_JSON (the parameters in words and numbers).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from contextual_bert.config import IngestConfig, ModelConfig, PlantedConfig
from contextual_bert.data.contract import DATE_COLUMN, DATE_TYPE, ContextColumn, DataSchema
from contextual_bert.data.planted import tastes_options as options
from contextual_bert.errors import ContextualBertError, DataError

TRUTH_FILE = "planted_truth.npz"
TRUTH_JSON = "planted_truth.json"
SOURCE = "planted"

# (column, number of values, informative): the customers' context. Noise columns test that a model
# ignores what does not matter.
CONTEXT_COLUMNS: tuple[tuple[str, int, bool], ...] = (
    ("region", 12, True),
    ("age_group", 8, True),
    ("segment", 6, True),
    ("channel", 4, False),
    ("signup_month", 12, False),
)
N_STYLES, N_COLORS, N_BRANDS = 30, 20, 40
COLOR_WEIGHT = 0.5  # a colour's affinity counts half as much as a style's
VALUE_ODDS_CONCENTRATION = 4.0  # Dirichlet concentration of each context column's value odds
HIDDEN_SEED_STREAM = 1  # the hidden styles' generator: default_rng([seed, HIDDEN_SEED_STREAM])
DATE_STREAM, CUSTOMER_TASTE_STREAM = 2, 3  # the outfits' dates and the customers' hidden tastes, likewise
DATE_START, DATE_SPAN_DAYS = np.datetime64("2022-01-01", "D"), 730  # outfits' dates: about two years


def _names(prefix: str, n: int) -> np.ndarray:
    width = len(str(max(n - 1, 0)))
    return np.array([f"{prefix}_{i:0{width}d}" for i in range(n)], dtype=object)


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = x.max(axis=axis, keepdims=True)
    return np.log(np.exp(x - top).sum(axis=axis)) + np.squeeze(top, axis=axis)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _categorical(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One draw per row of a (rows, choices) probability matrix (inverse CDF)."""
    cum = np.cumsum(probs, axis=1)
    u = rng.random(len(probs)) * cum[:, -1]
    return np.minimum((cum < u[:, None]).sum(axis=1), probs.shape[1] - 1)


@dataclass(frozen=True)
class PlantedTruth:
    """What the optimum needs, in the raw data's terms (article and customer rows of the raw tables)."""

    article_ids: np.ndarray  # (A,) str
    article_type: np.ndarray  # (A,) int, 0..n_types-1
    log_weight: np.ndarray  # (A, K) log w[a, z]
    customer_ids: np.ndarray  # (C,) str
    taste_prob: np.ndarray  # (C, K) P(z | x_c), marginalised over the hidden taste u where there is one
    n_types: int
    # the hidden per-customer taste (customer_taste_strength > 0 only): P(z | x_c, u) =
    # softmax(taste_logit[c] + customer_taste_table[u]), u uniform over the table's rows and unseen
    taste_logit: np.ndarray | None = None  # (C, K)
    customer_taste_table: np.ndarray | None = None  # (U, K)
    # the compatibility switch (tastes_options.py): the latent is the pair (lifestyle v, taste z), column v K + z
    # of log_weight, taste_prob, taste_logit and customer_taste_table; `lifestyle` (C,) each customer's v
    n_lifestyles: int = 1
    lifestyle: np.ndarray | None = None
    # context columns the optimum does not condition on (the paper's noise columns: tastes_options.py)
    ignored_context: tuple[str, ...] = ()

    @property
    def has_customer_taste(self) -> bool:
        return self.customer_taste_table is not None

    def log_taste_given_u(self) -> np.ndarray:
        """(C, U, K) log P(z | x_c, u)."""
        assert self.taste_logit is not None and self.customer_taste_table is not None, "a customer taste's truth"
        logits = self.taste_logit[:, None, :] + self.customer_taste_table[None, :, :]
        return logits - _logsumexp(logits, axis=-1)[..., None]

    @property
    def n_tastes(self) -> int:
        return self.log_weight.shape[1]

    def log_type_share(self) -> np.ndarray:
        """(A, K) log( w[a, z] / W[t(a), z] ): P(a | t(a), z)."""
        per_type = np.zeros((self.n_types, self.n_tastes))
        np.add.at(per_type, self.article_type, np.exp(self.log_weight - self.log_weight.max()))
        return self.log_weight - self.log_weight.max() - np.log(per_type[self.article_type])

    def population_prior(self) -> np.ndarray:
        """(K,) P(z) without the context: the mean of P(z | x_c) over the customers (each equally likely)."""
        return self.taste_prob.mean(axis=0)

    def save(self, out_dir: Path, about: dict) -> None:
        arrays: dict[str, np.ndarray | np.int64] = {}
        if self.taste_logit is not None and self.customer_taste_table is not None:  # has_customer_taste
            arrays |= {"taste_logit": self.taste_logit, "customer_taste_table": self.customer_taste_table}
        if self.lifestyle is not None:
            arrays |= {"n_lifestyles": np.int64(self.n_lifestyles), "lifestyle": self.lifestyle}
        if self.ignored_context:
            arrays["ignored_context"] = np.array(self.ignored_context, dtype=str)
        np.savez_compressed(
            Path(out_dir) / TRUTH_FILE,
            allow_pickle=True,  # numpy's default, named so that the arrays passed by name cannot be taken for it
            article_ids=self.article_ids.astype(str), article_type=self.article_type,
            log_weight=self.log_weight, customer_ids=self.customer_ids.astype(str), taste_prob=self.taste_prob,
            n_types=np.int64(self.n_types), **arrays,
        )  # fmt: skip
        (Path(out_dir) / TRUTH_JSON).write_text(json.dumps(about, indent=2))


def load_truth(raw_dir: Path):
    """The PlantedTruth in raw_dir (planted_source.load_truth reads either story's)."""
    path = Path(raw_dir) / TRUTH_FILE
    if not path.is_file():
        raise DataError("no planted truth here: the data was not made by `contextual-bert generate-planted`", path=path)
    try:
        with np.load(path, allow_pickle=False) as z:
            truth = PlantedTruth(
                article_ids=z["article_ids"], article_type=z["article_type"].astype(np.int64),
                log_weight=z["log_weight"].astype(np.float64), customer_ids=z["customer_ids"],
                taste_prob=z["taste_prob"].astype(np.float64), n_types=int(z["n_types"]),
                **({} if "customer_taste_table" not in z.files else {
                    "taste_logit": z["taste_logit"].astype(np.float64),
                    "customer_taste_table": z["customer_taste_table"].astype(np.float64)}),
                **({} if "lifestyle" not in z.files else {
                    "n_lifestyles": int(z["n_lifestyles"]), "lifestyle": z["lifestyle"].astype(np.int64)}),
                ignored_context=tuple(str(v) for v in z["ignored_context"]) if "ignored_context" in z.files else (),
            )  # fmt: skip
    except (KeyError, ValueError, OSError) as exc:
        raise DataError(f"not a readable planted truth file ({exc})", path=path) from None
    if truth.log_weight.shape[0] != len(truth.article_ids) or truth.taste_prob.shape[0] != len(truth.customer_ids):
        raise DataError("article or customer arrays disagree in length", path=path)
    return truth


# --- the story ---------------------------------------------------------------------------------------


def _catalogue(rng: np.random.Generator, cfg: PlantedConfig) -> dict:
    a, t = cfg.n_articles, cfg.n_types
    # every type gets an article: the first T articles take each type once, the rest uniformly
    article_type = np.concatenate([np.arange(t), rng.integers(0, t, a - t)])
    rng.shuffle(article_type)
    style = rng.integers(0, N_STYLES, a)
    color = rng.integers(0, N_COLORS, a)
    popularity = (rng.permutation(a) + 1.0) ** -cfg.popularity_exponent
    style_affinity = rng.normal(0, 1, (N_STYLES, cfg.n_tastes))
    color_affinity = rng.normal(0, 1, (N_COLORS, cfg.n_tastes))
    log_weight = np.log(popularity)[:, None] + cfg.taste_strength * (
        style_affinity[style] + COLOR_WEIGHT * color_affinity[color]
    )
    brand = rng.integers(0, N_BRANDS, a)
    price = np.round(np.exp(rng.normal(3.5, 0.6, a)), 2) + 1.0
    hidden_style = hidden_affinity = None
    if cfg.hidden_taste_strength > 0:  # its own generator: the story's draws stay those without it
        hidden_rng = np.random.default_rng([cfg.seed, HIDDEN_SEED_STREAM])
        hidden_style = hidden_rng.integers(0, N_STYLES, a)
        hidden_affinity = hidden_rng.normal(0, 1, (N_STYLES, cfg.n_tastes))
        log_weight = log_weight + cfg.hidden_taste_strength * hidden_affinity[hidden_style]
    return dict(type=article_type, style=style, color=color, popularity=popularity, brand=brand, price=price,
                style_affinity=style_affinity, color_affinity=color_affinity, log_weight=log_weight,
                hidden_style=hidden_style, hidden_affinity=hidden_affinity)  # fmt: skip


def _customers(rng: np.random.Generator, cfg: PlantedConfig) -> dict:
    values, tables, taste_logit = {}, {}, np.zeros((cfg.n_customers, cfg.n_tastes))
    for name, n_values, informative in CONTEXT_COLUMNS:
        odds = rng.dirichlet(np.full(n_values, VALUE_ODDS_CONCENTRATION))
        values[name] = rng.choice(n_values, cfg.n_customers, p=odds)
        if informative:
            tables[name] = rng.normal(0, cfg.context_strength, (n_values, cfg.n_tastes))
            taste_logit += tables[name][values[name]]
    cus: dict[str, Any] = dict(values=values, tables=tables, taste_prob=_softmax(taste_logit),
                               taste_logit=taste_logit, hidden=None, customer_taste_table=None)  # fmt: skip
    if cfg.customer_taste_strength > 0:  # its own generator: the story's draws stay those without it
        taste_rng = np.random.default_rng([cfg.seed, CUSTOMER_TASTE_STREAM])
        cus["hidden"] = taste_rng.integers(0, cfg.n_customer_tastes, cfg.n_customers)
        cus["customer_taste_table"] = cfg.customer_taste_strength * taste_rng.normal(
            0, 1, (cfg.n_customer_tastes, cfg.n_tastes)
        )
        # P(z | x_c): the mean over the unseen u, each equally likely
        cus["taste_prob"] = (
            _softmax((taste_logit[:, None, :] + cus["customer_taste_table"][None]).reshape(-1, cfg.n_tastes))
            .reshape(cfg.n_customers, cfg.n_customer_tastes, cfg.n_tastes)
            .mean(axis=1)
        )
    return cus


def _outfits(rng: np.random.Generator, cfg: PlantedConfig, cat: dict, cus: dict, max_set_size: int,
             min_set_size: int, switch: dict | None = None) -> dict:  # fmt: skip
    n, t = cfg.n_outfits, cfg.n_types
    customer = rng.integers(0, cfg.n_customers, n)
    if cus["hidden"] is None:
        taste_odds = cus["taste_prob"][customer]
    else:  # P(z | x, u) of the customer's own u: the same one draw per outfit from the story's generator
        taste_odds = _softmax(cus["taste_logit"][customer] + cus["customer_taste_table"][cus["hidden"][customer]])
    taste = _categorical(rng, taste_odds)
    size = rng.integers(min_set_size, max_set_size + 1, n)
    # n distinct types, uniformly: the first n of a random permutation of the types
    types = np.argsort(rng.random((n, t)), axis=1)[:, :max_set_size]
    keep = np.arange(max_set_size)[None, :] < size[:, None]
    draw_outfit = np.broadcast_to(np.arange(n)[:, None], types.shape)[keep]
    draw_type = types[keep]

    # P(a | t, z) = w[a, z] / W[t, z]: one categorical per (type, taste) group of draws; with the switch the
    # latent is the pair (lifestyle, taste), column v K + z of its log_weight (tastes_options.py)
    log_weight, n_latent, latent = cat["log_weight"], cfg.n_tastes, taste
    if switch is not None:
        log_weight, n_latent = switch["log_weight"], switch["log_weight"].shape[1]
        latent = switch["lifestyle"][customer] * cfg.n_tastes + taste
    article = np.empty(len(draw_type), dtype=np.int64)
    key = draw_type * n_latent + latent[draw_outfit]
    by_key = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.diff(key[by_key])) + 1
    for group in np.split(by_key, bounds):
        ty, z = divmod(int(key[group[0]]), n_latent)
        pool = np.flatnonzero(cat["type"] == ty)
        w = np.exp(log_weight[pool, z] - log_weight[pool, z].max())
        article[group] = rng.choice(pool, len(group), p=w / w.sum())
    order = np.lexsort((rng.random(len(draw_outfit)), draw_outfit))  # grouped by outfit, items shuffled
    date = outfit_dates(cfg.seed, n)
    return dict(customer=customer, taste=taste, size=size, draw_outfit=draw_outfit[order], article=article[order],
                date=date)  # fmt: skip


def _vocabulary(cfg: PlantedConfig) -> dict[str, np.ndarray]:
    """The articles' categorical columns' values (the paper's context's lists draw from them)."""
    return {"product_type": _names("type", cfg.n_types), "brand": _names("brand", N_BRANDS),
            "color": _names("color", N_COLORS), "style": _names("style", N_STYLES)}  # fmt: skip


def planted_schema(cfg: PlantedConfig | None = None) -> DataSchema:
    """The context columns of the planted tastes: CONTEXT_COLUMNS, and those of cfg's options."""
    return DataSchema(
        source=SOURCE,
        context_columns=tuple(
            ContextColumn(name, "customers", "categorical", nullable=False, values=tuple(_names(name, k)))
            for name, k, _ in CONTEXT_COLUMNS
        )
        + (() if cfg is None else options.context_columns(cfg, _vocabulary(cfg))),
    )


def _tables(cfg: PlantedConfig, cat: dict, cus: dict, out: dict, extra: dict) -> dict[str, pa.Table]:
    """The raw tables; `extra`: the options' columns of the articles and customers tables (tastes_options.py)."""
    article_id = _names("P", cfg.n_articles)
    customer_id = _names("PC", cfg.n_customers)
    articles = pa.table({
        "article_id": pa.array(article_id, pa.string()),
        "product_type": pa.array(_names("type", cfg.n_types)[cat["type"]], pa.string()),
        "brand": pa.array(_names("brand", N_BRANDS)[cat["brand"]], pa.string()),
        "color": pa.array(_names("color", N_COLORS)[cat["color"]], pa.string()),
        "style": pa.array(_names("style", N_STYLES)[cat["style"]], pa.string()),
        "price": pa.array(cat["price"], pa.float64()),
        **extra["articles"],
    })  # fmt: skip
    customers = pa.table({
        "customer_id": pa.array(customer_id, pa.string()),
        **{name: pa.array(_names(name, k)[cus["values"][name]], pa.string()) for name, k, _ in CONTEXT_COLUMNS},
        **extra["customers"],
    })  # fmt: skip
    outfits = outfits_table(customer_id[out["customer"]], article_id[out["article"]], out["size"], out["date"])
    return {"articles": articles, "customers": customers, "outfits": outfits}


def outfit_dates(seed: int, n: int) -> np.ndarray:
    """The outfits' dates: uniform over DATE_SPAN_DAYS days from DATE_START, from a generator of their own."""
    return DATE_START + np.random.default_rng([seed, DATE_STREAM]).integers(0, DATE_SPAN_DAYS, n).astype(
        "timedelta64[D]"
    )


def outfits_table(customer_ids: np.ndarray, article_ids: np.ndarray, sizes: np.ndarray, dates: np.ndarray) -> pa.Table:
    """The outfits table: outfit i (id PO_i) of customer_ids[i], its sizes[i] articles the next ones of article_ids."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    return pa.table({
        "outfit_id": pa.array(_names("PO", len(sizes)), pa.string()),
        "customer_id": pa.array(customer_ids, pa.string()),
        "article_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(article_ids, pa.string())),
        DATE_COLUMN: pa.array(dates, DATE_TYPE),
    })  # fmt: skip


def write_raw(out_dir: Path, tables: dict[str, pa.Table], schema: DataSchema, truth, about: dict, report: dict) -> None:
    """The raw contract (the tables, schema.json, ingest_report.json) and the truth (`truth.save`) into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        pq.write_table(table, out_dir / f"{name}.parquet")
    schema.save(out_dir)
    truth.save(out_dir, about)
    (out_dir / "ingest_report.json").write_text(json.dumps(report, indent=2))


def _entropy(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=-1)


def check_sizes(cfg: PlantedConfig, max_set_size: int) -> None:
    """Sizes no story can fill -> a one-line error."""
    if cfg.n_types < max_set_size:
        raise ContextualBertError(
            f"planted.n_types is {cfg.n_types}; an outfit of {max_set_size} items "
            f"(model.max_set_size) needs at least {max_set_size} product types"
        )
    if cfg.n_articles < cfg.n_types:
        raise ContextualBertError(
            f"planted.n_articles is {cfg.n_articles}; every one of the {cfg.n_types} product types needs an article"
        )


def generate_planted(
    cfg: PlantedConfig,
    out_dir: Path,
    max_set_size: int = ModelConfig().max_set_size,
    min_set_size: int = IngestConfig().min_set_size,
) -> dict:
    """Write the raw contract (tables, schema.json, ingest_report.json) and the truth into out_dir."""
    check_sizes(cfg, max_set_size)
    started = time.perf_counter()
    rng = np.random.default_rng(cfg.seed)
    cat = _catalogue(rng, cfg)
    cus = _customers(rng, cfg)
    switch = options.compatibility(cfg, cat)  # each option from a generator of its own: the story's draws stay
    out = _outfits(rng, cfg, cat, cus, max_set_size, min_set_size, switch)
    paper = options.paper_columns(cfg, _vocabulary(cfg))
    vectors = options.article_vectors(cfg, cat["log_weight"], cat["popularity"])
    tables = _tables(cfg, cat, cus, out, options.extra_columns(cfg, switch, paper, vectors))

    truth = PlantedTruth(
        article_ids=tables["articles"].column("article_id").to_numpy(zero_copy_only=False),
        article_type=cat["type"],
        customer_ids=tables["customers"].column("customer_id").to_numpy(zero_copy_only=False),
        n_types=cfg.n_types, ignored_context=tuple(column.name for column in paper),
        **options.latent_arrays(cat, cus, switch),
    )  # fmt: skip
    prior = cus["taste_prob"].mean(axis=0)  # P(z), the lifestyle summed out
    signal = {
        # I(z; x) = H(z) - H(z | x): how much the context says about the taste, in nats
        "taste_entropy_population": round(float(_entropy(prior)), 4),
        "taste_entropy_given_context": round(float(_entropy(cus["taste_prob"]).mean()), 4),
        "taste_entropy_max": round(float(np.log(cfg.n_tastes)), 4),
    }
    about = {
        "story": "see the docstring of contextual_bert/planted.py",
        # (without a later setting at its "off" value: the truth file of today's data stays byte for byte)
        "params": cfg.model_dump(exclude=(set() if cfg.hidden_taste_strength else {"hidden_taste_strength"}) | (
            set() if cfg.customer_taste_strength else {"customer_taste_strength", "n_customer_tastes"}) | {
            "closet_size", "rewear_probability"} | options.unused_settings(cfg)),
        "n_styles": N_STYLES, "n_colors": N_COLORS, "color_weight": COLOR_WEIGHT,
        "context_columns": [{"name": n, "n_values": k, "informative": i} for n, k, i in CONTEXT_COLUMNS],
        "context_tables": {name: table.round(6).tolist() for name, table in cus["tables"].items()},
        "style_affinity": cat["style_affinity"].round(6).tolist(),
        "color_affinity": cat["color_affinity"].round(6).tolist(),
        **({} if cat["hidden_style"] is None else {
            "hidden_style": cat["hidden_style"].tolist(),
            "hidden_affinity": cat["hidden_affinity"].round(6).tolist()}),
        "population_prior": prior.round(6).tolist(),
        "signal": signal,
        **({} if cus["hidden"] is None else {"customer_taste": cus["hidden"].tolist()}),
        **options.about(cfg, switch, paper),
    }  # fmt: skip
    report = {
        "source": SOURCE,
        "seed": cfg.seed,
        "size": {"n_outfits": cfg.n_outfits, "n_articles": cfg.n_articles, "n_customers": cfg.n_customers},
        "rows": {name: table.num_rows for name, table in tables.items()},
        "items_per_outfit": round(float(out["size"].mean()), 3),
        "articles_never_drawn": int(cfg.n_articles - len(np.unique(out["article"]))),
        "planted_signal": signal,
    }
    write_raw(Path(out_dir), tables, planted_schema(cfg), truth, about, report)
    # the time is returned, not written: data/raw stays byte-identical for the same settings (DVC's hash)
    return {**report, "seconds": round(time.perf_counter() - started, 2)}
