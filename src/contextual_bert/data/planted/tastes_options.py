"""The planted tastes' options (tastes.py), each off by default and then absent: the data is today's byte for byte.

Each draws from a generator of its own (default_rng([seed, stream])), so turning one on leaves every draw of the
story and of the other options as it was.

The compatibility switch (planted.compatibility_switch s > 0, planted.n_lifestyles V >= 2). Each customer c has a
lifestyle v_c, a context column (`LIFESTYLE`) of V values (odds from a Dirichlet(4) draw), independent of the
other columns and of the taste. The lifestyle does not move the taste: it changes which styles go with it. Each
lifestyle has its own style table, A_v = sqrt(1 - s^2) A + s E_v (A the story's style_affinity, E_v ~ N(0, 1)
drawn once per lifestyle), and an article's weight under taste z for a customer of lifestyle v is the story's
w[a, z] with A_v in place of A:

    w_v[a, z] = w[a, z] * exp(taste_strength * (A_v[s(a), z] - A[s(a), z]))

so the articles an outfit's taste draws, and so which styles share an outfit, depend on the lifestyle: under
one, taste z takes styles S1 and S2 together, under another S1 and S3 (s = 1: the tables are unrelated). Colours
and the hidden style go with the taste as before. The exact optimum is the story's with the latent the pair (v, z)
(L = V K values, index v K + z): P(a | t(a), v, z) = w_v[a, z] / W_v[t(a), z], and

    P(v, z | x_c) = 1[v = v_c] P(z | x_c)

so the truth holds log_weight (A, V K) and taste_prob (C, V K) (and with the hidden per-customer taste,
taste_logit (C, V K), -inf off the customer's lifestyle, and the table tiled over the lifestyles), and every
formula of optimum.py holds as it is: with the context the prior is the mean of P(v, z | x_c) over the customers
whose context (the lifestyle column included) encodes alike; without it, over all customers, which sums the
lifestyle out (the mixture over v of each lifestyle's compatibilities).

The paper's context (planted.context: paper). The customers also get the paper's twelve customer columns (age,
gender, country, preferred brands, colours and styles, no-go product types, three sizes, price range:
categorical, multi_categorical and numeric, as contract.PAPER_SCHEMA has them), every value drawn independently
of everything else: pure noise. With params.yaml's features.embedding_dims they take 688 of d_context (the
paper's 736 less the per-outfit occasion's 48), the planted columns 16 each (features.default_dim). The optimum
conditions on the planted columns only (the truth lists the paper's as `ignored_context`): they are independent of
the tastes, the lifestyle and the articles, so conditioning on them would change nothing but the number of
context combinations.

Article vectors (planted.vector_dim D > 0). Every article gets a float32 vector of D (VECTOR_COLUMN of the
articles table, list<float32>): its taste profile, log w[a, :] - log pop[a] (K values: how much each taste favours
it; with the hidden style, what no column carries), centred, projected by a random N(0, 1) (K, D) matrix, each
dimension scaled to std 1 over the articles, plus N(0, vector_noise^2) noise. The vectors are a function of the
truth and noise: they change no draw and no optimum; with vector_noise large they carry (almost) nothing.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from contextual_bert.data.contract import BOTTOM_SIZES, COUNTRIES, GENDERS, SHOE_SIZES, TOP_SIZES, ContextColumn

SWITCH_STREAM, PAPER_CONTEXT_STREAM, VECTOR_STREAM = 4, 5, 6  # default_rng([seed, stream]), as tastes.py's others
LIFESTYLE = "lifestyle"  # the switch's customer column
VECTOR_COLUMN = "style_vector"  # the articles table's vector column
ODDS_CONCENTRATION = 4.0  # Dirichlet concentration of a categorical column's value odds (tastes.py's too)


def unused_settings(cfg) -> set[str]:
    """The options' settings left out of the truth's params where they are off (today's truth file stays)."""
    unused = set()
    if not cfg.compatibility_switch:
        unused |= {"compatibility_switch", "n_lifestyles"}
    if cfg.context == "plain":
        unused.add("context")
    if not cfg.vector_dim:
        unused |= {"vector_dim", "vector_noise"}
    return unused


def context_columns(cfg, vocabulary: dict[str, np.ndarray]) -> tuple[ContextColumn, ...]:
    """The options' customer columns, after the story's: the switch's lifestyle, then the paper's (none by default)."""
    lifestyle = () if not cfg.compatibility_switch else (
        ContextColumn(LIFESTYLE, "customers", "categorical", nullable=False,
                      values=tuple(lifestyle_names(cfg.n_lifestyles))),)  # fmt: skip
    return lifestyle + paper_columns(cfg, vocabulary)


def extra_columns(cfg, switch: dict | None, paper: tuple, vectors: np.ndarray | None) -> dict[str, dict]:
    """The options' columns of the articles and the customers tables ({} each when every option is off)."""
    customers = {} if switch is None else {
        LIFESTYLE: pa.array(lifestyle_names(cfg.n_lifestyles)[switch["lifestyle"]], pa.string())}  # fmt: skip
    customers |= paper_values(cfg, paper)
    return {"articles": {} if vectors is None else {VECTOR_COLUMN: vector_array(vectors)}, "customers": customers}


def latent_arrays(cat: dict, cus: dict, switch: dict | None) -> dict:
    """PlantedTruth's latent arrays: over the tastes, or with the switch over the pairs (lifestyle, taste)."""
    hidden = cus["hidden"] is not None
    if switch is None:
        return dict(log_weight=cat["log_weight"], taste_prob=cus["taste_prob"], **({} if not hidden else dict(
            taste_logit=cus["taste_logit"], customer_taste_table=cus["customer_taste_table"])))  # fmt: skip
    n = len(switch["tables"])
    prob, logit, table = joint_taste(switch["lifestyle"], n, cus["taste_prob"], cus["taste_logit"],
                                     cus["customer_taste_table"])  # fmt: skip
    return dict(log_weight=switch["log_weight"], taste_prob=prob, n_lifestyles=n, lifestyle=switch["lifestyle"],
                **({} if not hidden else dict(taste_logit=logit, customer_taste_table=table)))  # fmt: skip


def about(cfg, switch: dict | None, paper: tuple) -> dict:
    """The options' entries of the truth's JSON (none when every option is off)."""
    out: dict[str, object] = {}
    if switch is not None:
        out["lifestyles"] = {
            "column": LIFESTYLE, "odds": switch["odds"].round(6).tolist(),
            "style_affinity": switch["tables"].round(6).tolist(), "customer_lifestyle": switch["lifestyle"].tolist(),
            "latent": "the pair (lifestyle v, taste z): column v * n_tastes + z of the truth's arrays",
        }  # fmt: skip
    if paper:
        out["ignored_context"] = [column.name for column in paper]
    if cfg.vector_dim:
        out["vectors"] = {"column": VECTOR_COLUMN, "dim": cfg.vector_dim, "noise": cfg.vector_noise}
    return out


# --- the compatibility switch -------------------------------------------------------------------------------


def lifestyle_names(n: int) -> np.ndarray:
    width = len(str(max(n - 1, 0)))
    return np.array([f"{LIFESTYLE}_{i:0{width}d}" for i in range(n)], dtype=object)


def compatibility(cfg, cat: dict) -> dict | None:
    """The lifestyles (None when the switch is off): each customer's, the per-lifestyle style tables, and
    log_weight (A, V K), log w_v[a, z] at column v K + z."""
    if not cfg.compatibility_switch:
        return None
    rng = np.random.default_rng([cfg.seed, SWITCH_STREAM])
    n, s = cfg.n_lifestyles, cfg.compatibility_switch
    odds = rng.dirichlet(np.full(n, ODDS_CONCENTRATION))
    lifestyle = rng.choice(n, cfg.n_customers, p=odds)
    shared = cat["style_affinity"]
    tables = np.sqrt(1.0 - s * s) * shared[None] + s * rng.normal(0, 1, (n, *shared.shape))  # (V, styles, K)
    shift = cfg.taste_strength * (tables[:, cat["style"]] - shared[cat["style"]][None])  # (V, A, K)
    log_weight = (cat["log_weight"][None] + shift).transpose(1, 0, 2).reshape(cfg.n_articles, -1)
    return dict(lifestyle=lifestyle, odds=odds, tables=tables, log_weight=log_weight)


def joint_taste(
    lifestyle: np.ndarray, n_lifestyles: int, taste_prob: np.ndarray, taste_logit=None, customer_taste_table=None
) -> tuple:
    """The truth's arrays over the pair (v, z) (index v K + z): (taste_prob (C, V K) = 1[v = v_c] P(z | x_c),
    taste_logit (C, V K) (-inf off v_c) or None, the hidden tastes' table (U, V K) or None)."""
    c, k = taste_prob.shape
    rows = np.arange(c)
    joint = np.zeros((c, n_lifestyles, k))
    joint[rows, lifestyle] = taste_prob
    logit: np.ndarray | None = None
    table: np.ndarray | None = None
    if customer_taste_table is not None:
        logit = np.full((c, n_lifestyles, k), -np.inf)
        logit[rows, lifestyle] = taste_logit
        logit = logit.reshape(c, -1)
        table = np.tile(customer_taste_table, (1, n_lifestyles))
    return joint.reshape(c, -1), logit, table


# --- the paper's context ----------------------------------------------------------------------------------


def _categorical(rng, n_customers: int, values) -> np.ndarray:
    odds = rng.dirichlet(np.full(len(values), ODDS_CONCENTRATION))
    return np.asarray(values, dtype=object)[rng.choice(len(values), n_customers, p=odds)]


def _lists(rng, n_customers: int, values, low: int, high: int) -> pa.Array:
    """Per customer low..high distinct values, uniformly."""
    values = np.asarray(values, dtype=object)
    count = rng.integers(low, min(high, len(values)) + 1, n_customers)
    order = np.argsort(rng.random((n_customers, len(values))), axis=1)
    return pa.array([list(values[order[i, : count[i]]]) for i in range(n_customers)], pa.list_(pa.string()))


LIST_LENGTHS = {"preferred_brands": (1, 4), "preferred_colors": (1, 3), "preferred_styles": (1, 3),
                "nogo_product_types": (0, 2)}  # fmt: skip  # the paper's lists: low..high distinct values each


def paper_columns(cfg, vocabulary: dict[str, np.ndarray]) -> tuple[ContextColumn, ...]:
    """The paper's twelve customer columns (none with context plain), as contract.PAPER_SCHEMA declares them but
    the lists' values: `vocabulary`, the planted articles' brand, color, style and product_type names."""
    if cfg.context == "plain":
        return ()

    def categorical(name, allowed):
        return ContextColumn(name, "customers", "categorical", nullable=False, values=tuple(allowed))

    def listed(name, column):
        return ContextColumn(name, "customers", "multi_categorical", False, values=tuple(map(str, vocabulary[column])))

    return (
        ContextColumn("age", "customers", "numeric", nullable=False, min_value=16, max_value=100),
        categorical("gender", GENDERS),
        categorical("country", COUNTRIES),
        listed("preferred_brands", "brand"),
        listed("preferred_colors", "color"),
        listed("preferred_styles", "style"),
        listed("nogo_product_types", "product_type"),
        categorical("size_top", TOP_SIZES),
        categorical("size_bottom", BOTTOM_SIZES),
        categorical("size_shoes", SHOE_SIZES),
        ContextColumn("price_min", "customers", "numeric", nullable=False, min_value=0),
        ContextColumn("price_max", "customers", "numeric", nullable=False, min_value=0),
    )


def paper_values(cfg, columns: tuple[ContextColumn, ...]) -> dict[str, pa.Array]:
    """The customers' values of the paper's columns (paper_columns), each drawn independently of everything."""
    if not columns:
        return {}
    rng = np.random.default_rng([cfg.seed, PAPER_CONTEXT_STREAM])
    n, values = cfg.n_customers, {}
    for column in columns:
        if column.kind == "categorical":
            values[column.name] = pa.array(_categorical(rng, n, column.values), pa.string())
        elif column.kind == "multi_categorical":
            values[column.name] = _lists(rng, n, column.values, *LIST_LENGTHS[column.name])
        elif column.name == "age":
            values["age"] = pa.array(rng.integers(16, 81, n).astype(np.float64), pa.float64())
        elif column.name == "price_min":
            values["price_min"] = pa.array(np.round(np.exp(rng.normal(3.0, 0.5, n)), 2), pa.float64())
        else:  # price_max: above price_min
            above = np.round(np.exp(rng.normal(3.8, 0.4, n)), 2)
            values["price_max"] = pa.array(values["price_min"].to_numpy() + above, pa.float64())
    return values


# --- article vectors --------------------------------------------------------------------------------------


def article_vectors(cfg, log_weight: np.ndarray, popularity: np.ndarray) -> np.ndarray | None:
    """(A, vector_dim) float32, each article's taste profile projected plus noise (None when vector_dim is 0).
    log_weight (A, K): the story's log w[a, z] (without the switch's per-lifestyle shift)."""
    if not cfg.vector_dim:
        return None
    rng = np.random.default_rng([cfg.seed, VECTOR_STREAM])
    profile = log_weight - np.log(popularity)[:, None]
    profile = profile - profile.mean(axis=0, keepdims=True)
    signal = profile @ rng.normal(0, 1, (profile.shape[1], cfg.vector_dim))
    scale = signal.std(axis=0)
    signal = signal / np.where(scale > 0, scale, 1.0)
    return (signal + rng.normal(0, cfg.vector_noise, signal.shape)).astype(np.float32)


def vector_array(vectors: np.ndarray) -> pa.Array:
    """The vectors as a list<float32> column (every list vector_dim long)."""
    offsets = np.arange(0, vectors.size + 1, vectors.shape[1], dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(vectors.reshape(-1), pa.float32()))
