"""The synthetic stylist's world (the story is `synthetic.py`'s docstring): its vocabulary and odds (styles and
their palettes, product types, occasion rules, outfit sizes, the article weights), the weighted draws, and the
catalogue and the customers. `synthetic.py` draws the outfits from them and writes the tables."""

from __future__ import annotations

import numpy as np

from contextual_bert.data.contract import BOTTOM_SIZES, COUNTRIES, GENDERS, SHOE_SIZES, TOP_SIZES
from contextual_bert.errors import ContextualBertError

STYLES = (
    "casual", "classic", "business", "elegant", "sporty", "streetwear",
    "boho", "minimalist", "romantic", "rock", "preppy", "outdoor",
)  # fmt: skip
COLORS = (
    "black", "white", "grey", "navy", "blue", "beige", "brown", "green",
    "olive", "red", "burgundy", "pink", "yellow", "orange", "purple", "khaki",
)  # fmt: skip
STYLE_PALETTES = {
    "casual": ("blue", "white", "grey", "beige", "green"),
    "classic": ("navy", "white", "beige", "brown", "burgundy"),
    "business": ("navy", "grey", "black", "white"),
    "elegant": ("black", "burgundy", "navy", "beige"),
    "sporty": ("black", "white", "grey", "red", "blue", "orange"),
    "streetwear": ("black", "white", "olive", "orange", "yellow", "khaki"),
    "boho": ("brown", "beige", "olive", "orange", "yellow"),
    "minimalist": ("black", "white", "grey", "beige"),
    "romantic": ("pink", "white", "red", "purple", "beige"),
    "rock": ("black", "grey", "burgundy", "red"),
    "preppy": ("navy", "white", "green", "red", "khaki"),
    "outdoor": ("green", "olive", "brown", "khaki", "orange"),
}

SLOTS = ("top", "bottom", "dress", "shoes", "outerwear", "accessory")
FITS = ("regular", "petite", "plus", "narrow", "wide", "one size")
# name: (slot, cut for: "w" women only, "m" men only, "wm" both, base price in EUR)
PRODUCT_TYPES: dict[str, tuple[str, str, float]] = {
    "t-shirt": ("top", "wm", 20), "shirt": ("top", "wm", 45), "blouse": ("top", "w", 40),
    "sweater": ("top", "wm", 50), "hoodie": ("top", "wm", 45), "polo shirt": ("top", "wm", 35),
    "tank top": ("top", "w", 15), "sports top": ("top", "wm", 30),
    "jeans": ("bottom", "wm", 60), "trousers": ("bottom", "wm", 55), "chinos": ("bottom", "wm", 50),
    "skirt": ("bottom", "w", 40), "shorts": ("bottom", "wm", 30), "leggings": ("bottom", "w", 30),
    "sports shorts": ("bottom", "wm", 25), "joggers": ("bottom", "wm", 40),
    "dress": ("dress", "w", 70), "jumpsuit": ("dress", "w", 75),
    "sneakers": ("shoes", "wm", 80), "boots": ("shoes", "wm", 110), "heels": ("shoes", "w", 90),
    "loafers": ("shoes", "wm", 85), "sandals": ("shoes", "wm", 45), "running shoes": ("shoes", "wm", 100),
    "dress shoes": ("shoes", "m", 110),
    "jacket": ("outerwear", "wm", 90), "coat": ("outerwear", "wm", 150), "blazer": ("outerwear", "wm", 110),
    "cardigan": ("outerwear", "wm", 45), "rain jacket": ("outerwear", "wm", 80),
    "bag": ("accessory", "wm", 60), "belt": ("accessory", "wm", 30), "scarf": ("accessory", "wm", 25),
    "hat": ("accessory", "wm", 25), "sunglasses": ("accessory", "wm", 40), "jewellery": ("accessory", "wm", 30),
    "watch": ("accessory", "wm", 80), "cap": ("accessory", "wm", 20),
}  # fmt: skip

# Per occasion: how often a woman wears a dress, how often an outer layer, the product types it favours
# (others of the slot keep weight UNLISTED_TYPE_WEIGHT) and the styles that suit it.
UNLISTED_TYPE_WEIGHT = 0.05
OCCASION_RULES: dict[str, dict] = {
    "casual": dict(
        p_dress=0.15, p_outer=0.35,
        types={"t-shirt": 3, "sweater": 1.5, "hoodie": 1.5, "shirt": 1, "polo shirt": 1, "tank top": 1,
               "jeans": 3, "chinos": 1.5, "shorts": 1, "skirt": 1, "joggers": 0.5,
               "sneakers": 3, "boots": 1, "sandals": 1, "loafers": 0.5,
               "jacket": 2, "cardigan": 1.5, "coat": 1, "dress": 1, "jumpsuit": 1,
               "bag": 2, "cap": 1, "sunglasses": 1, "belt": 1, "scarf": 1, "hat": 0.5, "watch": 1, "jewellery": 1},
        styles={"casual": 4, "streetwear": 2, "minimalist": 2, "boho": 1.5, "preppy": 1},
    ),
    "office": dict(
        p_dress=0.2, p_outer=0.6,
        types={"shirt": 4, "blouse": 3, "sweater": 1, "polo shirt": 0.5,
               "trousers": 4, "chinos": 2, "skirt": 1.5,
               "loafers": 3, "dress shoes": 3, "heels": 1.5, "boots": 0.5,
               "blazer": 4, "coat": 1.5, "cardigan": 1, "dress": 1, "jumpsuit": 0.3,
               "bag": 3, "belt": 2, "watch": 2, "jewellery": 1, "scarf": 0.5},
        styles={"business": 5, "classic": 3, "minimalist": 2, "preppy": 1.5, "elegant": 1},
    ),
    "party": dict(
        p_dress=0.5, p_outer=0.3,
        types={"shirt": 2, "blouse": 2, "tank top": 1.5, "t-shirt": 1,
               "jeans": 2, "skirt": 2, "trousers": 1.5,
               "heels": 3, "boots": 2, "sneakers": 1, "dress shoes": 1,
               "jacket": 2, "blazer": 1.5, "dress": 3, "jumpsuit": 1.5,
               "bag": 2, "jewellery": 3, "watch": 1, "belt": 1, "sunglasses": 0.3},
        styles={"elegant": 3, "rock": 3, "romantic": 2, "streetwear": 2, "boho": 1},
    ),
    "sport": dict(
        p_dress=0.0, p_outer=0.25,
        types={"sports top": 6, "t-shirt": 2, "tank top": 1.5, "hoodie": 1,
               "sports shorts": 4, "leggings": 4, "joggers": 3, "shorts": 1,
               "running shoes": 6, "sneakers": 2,
               "jacket": 1, "rain jacket": 1.5,
               "cap": 3, "bag": 2, "watch": 2, "sunglasses": 1},
        styles={"sporty": 8, "outdoor": 2, "streetwear": 1},
    ),
    "vacation": dict(
        p_dress=0.35, p_outer=0.15,
        types={"t-shirt": 2, "tank top": 2, "shirt": 1.5, "polo shirt": 1.5, "blouse": 1,
               "shorts": 4, "skirt": 1.5, "chinos": 1, "jeans": 1,
               "sandals": 4, "sneakers": 2,
               "cardigan": 1.5, "jacket": 1, "dress": 3, "jumpsuit": 2,
               "sunglasses": 4, "hat": 3, "bag": 2, "jewellery": 1, "scarf": 0.5},
        styles={"casual": 3, "boho": 3, "romantic": 1.5, "minimalist": 1, "preppy": 1},
    ),
    "formal": dict(
        p_dress=0.6, p_outer=0.55,
        types={"shirt": 4, "blouse": 3, "trousers": 4, "skirt": 2,
               "dress shoes": 4, "heels": 4, "loafers": 1.5,
               "blazer": 4, "coat": 2, "dress": 4, "jumpsuit": 1,
               "jewellery": 3, "watch": 2, "bag": 2, "belt": 2},
        styles={"elegant": 6, "classic": 4, "business": 2},
    ),
    "outdoor": dict(
        p_dress=0.0, p_outer=0.8,
        types={"t-shirt": 2, "sweater": 2, "hoodie": 2, "shirt": 1, "sports top": 1,
               "trousers": 2, "joggers": 2, "shorts": 1.5, "leggings": 1, "jeans": 1,
               "boots": 5, "sneakers": 2, "running shoes": 1,
               "rain jacket": 5, "jacket": 3, "coat": 1,
               "hat": 2, "cap": 2, "bag": 2, "sunglasses": 2, "scarf": 1, "watch": 1},
        styles={"outdoor": 8, "sporty": 2, "casual": 2},
    ),
}  # fmt: skip
OCCASION_BASE_ODDS = {"casual": 5, "office": 2.5, "party": 1.5, "sport": 1.2, "vacation": 1, "formal": 0.6,
                      "outdoor": 1.0}  # fmt: skip
NORTHERN = ("SE", "NL", "DE", "PL", "BE")  # more outer layers

# Odds of the outfit sizes ingest.min_set_size, the next, ... (4..8 by default; those above
# model.max_set_size are not drawn).
SIZE_ODDS = np.array([0.32, 0.28, 0.2, 0.12, 0.08])

# Article weights within a product type (see synthetic.py's docstring).
ANCHOR_STYLE_BOOST, OTHER_PREFERRED_STYLE_BOOST = 15.0, 2.0
PREFERRED_BRAND_BOOST, PREFERRED_COLOR_BOOST = 4.0, 3.0
OUT_OF_PRICE_RANGE, ANCHOR_FROM_CUSTOMER = 0.15, 0.8
FIT_REGULAR_ARTICLE, FIT_MISMATCH = 0.5, 0.1
_MAX_SAMPLING_CELLS = 4_000_000  # rows x candidates per chunk of the weighted draw
# Hidden tastes (synthetic.py's docstring): the factors at customer_taste_strength s are 1 + s * these.
HIDDEN_BRAND_GAIN, HIDDEN_COLOR_GAIN = 2.0, 1.0
# Streams of their own beside the story's default_rng(seed): default_rng([seed, stream]).
DATE_STREAM, TASTE_STREAM = 1, 2
DATE_START, DATE_SPAN_DAYS = np.datetime64("2022-01-01", "D"), 730  # outfits' dates: about two years


def _gumbel_top_k(rng: np.random.Generator, log_weights: np.ndarray, k: int) -> np.ndarray:
    """Per row, k distinct column indices drawn without replacement with probability ~ exp(log_weights),
    in the order drawn (the Gumbel top-k trick)."""
    keys = log_weights + rng.gumbel(size=log_weights.shape)
    if k >= keys.shape[1]:
        return np.argsort(-keys, axis=1, kind="stable")[:, :k]
    top = np.argpartition(-keys, k - 1, axis=1)[:, :k]
    return np.take_along_axis(top, np.argsort(-np.take_along_axis(keys, top, axis=1), axis=1), axis=1)


def _log(weights: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(weights)


def _categorical(rng: np.random.Generator, weights: np.ndarray) -> np.ndarray:
    """One draw per row of a (rows, choices) weight matrix."""
    return np.argmax(_log(weights) + rng.gumbel(size=weights.shape), axis=1)


def _mask_rows(rng: np.random.Generator, weights: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(rows, vocab) bool: per row, `counts[row]` distinct columns drawn without replacement by weight
    (fewer where fewer columns have a weight above zero)."""
    counts = np.minimum(counts, (weights > 0).sum(axis=1))
    k = int(counts.max(initial=0))
    mask = np.zeros(weights.shape, dtype=bool)
    if k == 0:
        return mask
    top = _gumbel_top_k(rng, _log(weights), k)
    keep = np.arange(k)[None, :] < counts[:, None]
    rows = np.broadcast_to(np.arange(len(weights))[:, None], top.shape)
    mask[rows[keep], top[keep]] = True
    return mask


# --- catalogue ---------------------------------------------------------------------------------------


def _make_articles(rng: np.random.Generator, n_articles: int) -> dict:
    type_names = list(PRODUCT_TYPES)
    type_slot = np.array([SLOTS.index(PRODUCT_TYPES[t][0]) for t in type_names])
    # (type, gender) pairs that must exist: 0 women, 1 men, 2 unisex.
    required = [(t, g) for t, name in enumerate(type_names) for g in (0, 1) if "wm"[g] in PRODUCT_TYPES[name][1]]
    if n_articles < len(required):
        raise ContextualBertError(
            f"generate: n_articles is {n_articles}; at least {len(required)} are needed to cover every product type "
            "for every gender it is cut for"
        )
    n_brands = int(np.clip(n_articles // 40, 8, 1000))

    brand_styles = _mask_rows(rng, np.ones((n_brands, len(STYLES))), rng.integers(1, 3, n_brands))
    brand_level = np.exp(rng.normal(0, 0.35, n_brands))
    brand_pop = np.exp(rng.normal(0, 0.8, n_brands))

    slot_odds = {"top": 3, "bottom": 2.5, "dress": 1, "shoes": 2, "outerwear": 1.5, "accessory": 2.5}
    type_odds = np.array([slot_odds[PRODUCT_TYPES[t][0]] / sum(
        PRODUCT_TYPES[u][0] == PRODUCT_TYPES[t][0] for u in type_names) for t in type_names])  # fmt: skip
    n_free = n_articles - len(required)
    product_type = np.concatenate(
        [np.array([t for t, _ in required]), rng.choice(len(type_names), n_free, p=type_odds / type_odds.sum())]
    )
    cut = np.array([PRODUCT_TYPES[type_names[t]][1] for t in product_type])
    free_gender = rng.choice(3, n_free, p=[0.45, 0.4, 0.15])
    gender = np.concatenate([np.array([g for _, g in required]), free_gender])
    gender = np.where(cut == "w", 0, np.where(cut == "m", 1, gender))
    accessory = type_slot[product_type] == SLOTS.index("accessory")
    gender = np.where(accessory & (rng.random(n_articles) < 0.5), 2, gender)

    # Every brand has articles: the first n_brands draws are a permutation, the rest by popularity.
    brand = np.concatenate(
        [rng.permutation(n_brands), rng.choice(n_brands, max(0, n_articles - n_brands), p=brand_pop / brand_pop.sum())]
    )[:n_articles]
    rng.shuffle(brand)
    house = _categorical(rng, brand_styles[brand].astype(float))
    style = np.where(rng.random(n_articles) < 0.8, house, rng.integers(0, len(STYLES), n_articles))
    palette = np.array([[c in STYLE_PALETTES[s] for c in COLORS] for s in STYLES])
    color = _categorical(rng, 1.0 + 5.0 * palette[style])

    base_price = np.array([PRODUCT_TYPES[t][2] for t in type_names])[product_type]
    price = np.round(np.maximum(base_price * brand_level[brand] * np.exp(rng.normal(0, 0.25, n_articles)), 1.0), 2)

    slot_name = np.array(SLOTS)[type_slot[product_type]]
    sized_body = np.isin(slot_name, ("top", "bottom", "dress", "outerwear"))
    body_fit = rng.choice([0, 1, 2], n_articles, p=[0.6, 0.2, 0.2])  # regular, petite, plus
    shoe_fit = rng.choice([0, 3, 4], n_articles, p=[0.6, 0.2, 0.2])  # regular, narrow, wide
    fit = np.where(sized_body, body_fit, np.where(slot_name == "shoes", shoe_fit, FITS.index("one size")))
    popularity = np.exp(rng.normal(0, 0.7, n_articles)) * np.sqrt(brand_pop[brand])
    return dict(
        n=n_articles, n_brands=n_brands, brand_styles=brand_styles, brand_level=brand_level, brand_pop=brand_pop,
        product_type=product_type, slot=type_slot[product_type], gender=gender, brand=brand, style=style,
        color=color, price=price, fit=fit, popularity=popularity,
    )  # fmt: skip


# --- customers ---------------------------------------------------------------------------------------


def _make_customers(rng: np.random.Generator, n_customers: int, art: dict) -> dict:
    n = n_customers
    gender = rng.choice(len(GENDERS), n, p=[0.55, 0.42, 0.03])
    age = np.round(np.clip(rng.normal(38, 13, n), 16, 85))
    country = rng.choice(len(COUNTRIES), n, p=[0.3, 0.14, 0.1, 0.1, 0.08, 0.08, 0.05, 0.05, 0.05, 0.05])

    young, old = age < 30, age >= 50
    style_w = np.ones((n, len(STYLES)))
    for s, f in {"streetwear": 3, "sporty": 2, "casual": 1.5}.items():
        style_w[:, STYLES.index(s)] *= np.where(young, f, 1)
    for s, f in {"classic": 3, "elegant": 2, "outdoor": 1.5}.items():
        style_w[:, STYLES.index(s)] *= np.where(old, f, 1)
    for s in ("romantic", "boho"):
        style_w[:, STYLES.index(s)] *= np.where(gender == 1, 0.3, 1.5)
    style_w *= np.isin(np.arange(len(STYLES)), art["style"])[None, :]  # only styles the catalogue has
    styles = _mask_rows(rng, style_w, rng.choice([1, 2, 3], n, p=[0.35, 0.45, 0.2]))

    budget = np.exp(rng.normal(0, 0.45, n))
    price_min = np.round(10 * budget * rng.uniform(0.5, 1.2, n))
    price_max = np.round(np.maximum(110 * budget * rng.uniform(0.8, 1.4, n), price_min + 10))

    # Brands: mostly of the customer's styles, near their budget.
    n_brands = np.minimum(rng.choice([1, 2, 3, 4, 5], n, p=[0.2, 0.3, 0.25, 0.15, 0.1]), art["n_brands"])
    brands = np.zeros((n, art["n_brands"]), dtype=bool)
    chunk = max(1, _MAX_SAMPLING_CELLS // art["n_brands"])
    for start in range(0, n, chunk):  # (customers x brands) weights, a chunk of customers at a time
        part = slice(start, start + chunk)
        of_my_styles = (styles[part].astype(np.float32) @ art["brand_styles"].T.astype(np.float32)) > 0
        level_gap = np.log(art["brand_level"])[None, :] - np.log(budget[part])[:, None]
        brand_w = art["brand_pop"][None, :] * (1 + 6 * of_my_styles) * np.exp(-0.5 * (level_gap / 0.4) ** 2)
        brands[part] = _mask_rows(rng, brand_w, n_brands[part])

    palette = np.array([[c in STYLE_PALETTES[s] for c in COLORS] for s in STYLES], dtype=np.float32)
    color_w = (1 + 3 * (styles.astype(np.float32) @ palette > 0)) * np.isin(np.arange(len(COLORS)), art["color"])
    colors = _mask_rows(rng, color_w, rng.choice([1, 2, 3, 4], n, p=[0.3, 0.35, 0.25, 0.1]))

    # No-go types: at most one per slot, among types cut for the customer.
    type_names = list(PRODUCT_TYPES)
    type_slot = np.array([SLOTS.index(PRODUCT_TYPES[t][0]) for t in type_names])
    slot_w = np.ones((n, len(SLOTS)))
    slot_w[:, SLOTS.index("dress")] = np.where(gender == 1, 0, 0.5)
    nogo_slots = _mask_rows(rng, slot_w, rng.choice([0, 1, 2, 3], n, p=[0.35, 0.35, 0.2, 0.1]))
    type_w = _cut_for(gender).astype(float) * nogo_slots[:, type_slot]
    nogo = np.zeros((n, len(type_names)), dtype=bool)
    for slot in range(len(SLOTS)):  # one draw per slot, over that slot's few types
        cols = np.flatnonzero(type_slot == slot)
        rows = np.flatnonzero(nogo_slots[:, slot])
        nogo[rows, cols[_categorical(rng, type_w[np.ix_(rows, cols)])]] = True

    top_size = np.clip(np.round(rng.normal(np.where(gender == 1, 2.8, 1.8), 1.0)), 0, len(TOP_SIZES) - 1)
    bottom_size = np.clip(np.round(top_size * 1.3 + rng.normal(0.5, 0.8, n)), 0, len(BOTTOM_SIZES) - 1)
    shoe_size = np.clip(np.round(rng.normal(np.where(gender == 1, 8.0, 4.0), 1.5)), 0, len(SHOE_SIZES) - 1)
    body_fit = lambda index, low, high: np.where(index <= low, 1, np.where(index >= high, 2, 0))  # noqa: E731
    fit = np.stack(  # the fit that suits the customer, per slot (regular, petite, plus / narrow, wide)
        [
            body_fit(top_size, 1, 4),  # top
            body_fit(bottom_size, 1, 5),  # bottom
            body_fit(top_size, 1, 4),  # dress
            np.where(shoe_size <= 2, 3, np.where(shoe_size >= 9, 4, 0)),  # shoes
            body_fit(top_size, 1, 4),  # outerwear
            np.full(n, FITS.index("one size")),  # accessory
        ],
        axis=1,
    )
    return dict(
        n=n, gender=gender, age=age, country=country, styles=styles, brands=brands, colors=colors, nogo=nogo,
        top_size=top_size.astype(int), bottom_size=bottom_size.astype(int), shoe_size=shoe_size.astype(int),
        price_min=price_min, price_max=price_max, fit=fit, activity=np.exp(rng.normal(0, 0.8, n)),
    )  # fmt: skip


def _cut_for(customer_gender: np.ndarray) -> np.ndarray:
    """(customers, types) bool: which product types are cut for each customer (diverse: all)."""
    cut = np.array([PRODUCT_TYPES[t][1] for t in PRODUCT_TYPES])
    women = np.isin(cut, ("w", "wm"))
    men = np.isin(cut, ("m", "wm"))
    return np.where((customer_gender == 0)[:, None], women, np.where((customer_gender == 1)[:, None], men, True))


def _hidden_tastes(rng: np.random.Generator, n_customers: int, art: dict, strength: float) -> dict:
    """Per customer a hidden favourite brand and colour (synthetic.py's docstring) and their weight factors; none at
    strength 0."""
    if strength == 0:
        return dict(hidden_brand=None, hidden_color=None)
    colors = np.unique(art["color"])  # colours the catalogue has
    return dict(hidden_brand=rng.integers(0, art["n_brands"], n_customers),
                hidden_color=colors[rng.integers(0, len(colors), n_customers)],
                hidden_brand_factor=np.float32(1 + strength * HIDDEN_BRAND_GAIN),
                hidden_color_factor=np.float32(1 + strength * HIDDEN_COLOR_GAIN))  # fmt: skip
