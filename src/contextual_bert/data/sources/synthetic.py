"""Synthetic outfits, made as a stylist would make them for a customer: the embedded default data.

The generative story (every step is vectorized with numpy; one `numpy.random.Generator` seeded once, so a
seed fixes the data):

Catalogue. Brands each have one or two house styles, a price level and a popularity. An article gets a
product type (which fixes its slot: top, bottom, dress, shoes, outerwear, accessory, and who it is cut for:
women, men, or unisex), a brand, a style (mostly one of its brand's house styles), a colour (mostly from its
style's palette), a fit for sized slots (petite / regular / plus; narrow / regular / wide for shoes) and a
price = product-type base price x brand price level x noise. Every product type exists for every gender it
is cut for, and every brand has articles, so every preference below points at something real.

Customers. Gender, age and country; one to three preferred styles (age shifts which: streetwear and sporty
when young, classic and elegant when older); one to five preferred brands (mostly brands of those styles, near
the customer's budget); one to four preferred colours (mostly from those styles' palettes); zero to three
no-go product types (at most one per slot); clothing sizes (top, bottom, shoes; they decide which fit suits
the customer); a price range [price_min, price_max] around a budget.

Outfits. A customer is drawn (some customers are far more active than others), then an occasion (its odds
shift with the customer's styles: a sporty customer dresses for sport more often), then the outfit's anchor
style (80%: one of the customer's styles that suits the occasion; 20%: a style of the occasion alone), then a
size of 4-8 items. Slots follow the occasion: top + bottom or a dress (occasion-dependent odds) + shoes, an
outer layer (occasion- and country-dependent odds), accessories filling the rest, each of a distinct type.
Each slot's product type is drawn from the occasion's odds (sport -> sportswear, office -> shirts, trousers,
blazers, ...) among types cut for the customer's gender, never a no-go type of the customer. The article of
each slot is then drawn from that type's articles with weight

    popularity x 15 if its style is the anchor style (2 if it is another preferred style of the customer)
               x 4 if its brand is preferred x 3 if its colour is preferred
               x 0.15 if its price is outside the customer's range x fit (1 match, 0.5 regular, 0.1 other).

So the articles alone are informative (they share the anchor style, colour palettes and gender), and the
context tells more: the preferred brands and colours, the budget, the fit and the occasion shift every choice,
and no-go types never appear. No choice is deterministic: every weight above leaves room for the others.

Tastes the customers table does not hold. A stylist's customer has a favourite brand and colour that no form
asked for: each customer gets a hidden favourite brand and a hidden favourite colour, uniform over the
catalogue's, drawn independently of the declared preferences and written to no table. They multiply an
article's weight by 1 + 2s (its brand) and 1 + s (its colour), s = generate.customer_taste_strength
(default 1: x3 and x2, as strong as a declared colour, weaker than a declared brand). What a customer's
earlier outfits show beyond the context is then real: the history feature (history.py) has something to
find. s = 0 leaves them out and the article draws are exactly those without them.

Dates. Each outfit has a date (contract.DATE_COLUMN), uniform over DATE_SPAN_DAYS days from DATE_START, so a
customer's outfits are ordered in time.

The hidden tastes and the dates come from generators of their own (default_rng([seed, TASTE_STREAM]) and
[seed, DATE_STREAM]), so no draw of the story above moves with them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from contextual_bert.config import GenerateConfig, GeneratorSize, IngestConfig, ModelConfig
from contextual_bert.data.contract import (
    BOTTOM_SIZES,
    COUNTRIES,
    DATE_COLUMN,
    DATE_TYPE,
    GENDERS,
    OCCASIONS,
    PAPER_SCHEMA,
    SHOE_SIZES,
    TOP_SIZES,
    DataSchema,
)
from contextual_bert.data.sources.synthetic_world import (
    _MAX_SAMPLING_CELLS,
    ANCHOR_FROM_CUSTOMER,
    ANCHOR_STYLE_BOOST,
    COLORS,
    DATE_SPAN_DAYS,
    DATE_START,
    DATE_STREAM,
    FIT_MISMATCH,
    FIT_REGULAR_ARTICLE,
    FITS,
    NORTHERN,
    OCCASION_BASE_ODDS,
    OCCASION_RULES,
    OTHER_PREFERRED_STYLE_BOOST,
    OUT_OF_PRICE_RANGE,
    PREFERRED_BRAND_BOOST,
    PREFERRED_COLOR_BOOST,
    PRODUCT_TYPES,
    SIZE_ODDS,
    SLOTS,
    STYLES,
    TASTE_STREAM,
    UNLISTED_TYPE_WEIGHT,
    _categorical,
    _cut_for,
    _gumbel_top_k,
    _hidden_tastes,
    _log,
    _make_articles,
    _make_customers,
)
from contextual_bert.errors import ContextualBertError


def _ids(prefix: str, n: int, width: int) -> np.ndarray:
    return np.char.add(prefix, np.char.zfill(np.arange(n).astype(str), width)).astype(object)


def _list_column(mask: np.ndarray, vocab) -> pa.Array:
    """A (rows, vocab) bool mask as a list<string> column, values in vocabulary order."""
    rows, cols = np.nonzero(mask)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=len(mask)))]).astype(np.int32)
    values = pa.array(np.asarray(vocab, dtype=object)[cols], type=pa.string())
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _dates(rng: np.random.Generator, n_outfits: int) -> np.ndarray:
    """Each outfit's day, uniform over DATE_SPAN_DAYS days from DATE_START."""
    return DATE_START + rng.integers(0, DATE_SPAN_DAYS, n_outfits).astype("timedelta64[D]")


# --- outfits -----------------------------------------------------------------------------------------


def _occasion_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    type_names = list(PRODUCT_TYPES)
    type_w = np.array([[OCCASION_RULES[o]["types"].get(t, UNLISTED_TYPE_WEIGHT) for t in type_names]
                       for o in OCCASIONS])  # fmt: skip
    style_w = np.array([[OCCASION_RULES[o]["styles"].get(s, 0.2) for s in STYLES] for o in OCCASIONS])
    p_dress = np.array([OCCASION_RULES[o]["p_dress"] for o in OCCASIONS])
    p_outer = np.array([OCCASION_RULES[o]["p_outer"] for o in OCCASIONS])
    return type_w, style_w, p_dress, p_outer


def _size_odds(min_set_size: int, max_set_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(sizes, their odds): SIZE_ODDS from min_set_size on, without the sizes above max_set_size."""
    sizes = np.arange(min_set_size, min_set_size + len(SIZE_ODDS))
    keep = sizes <= max_set_size
    if not keep.any():
        raise ContextualBertError(
            f"model.max_set_size {max_set_size} is below the smallest outfit, ingest.min_set_size {min_set_size}"
        )
    return sizes[keep], SIZE_ODDS if keep.all() else SIZE_ODDS[keep] / SIZE_ODDS[keep].sum()


def _make_outfits(
    rng: np.random.Generator, n_outfits: int, art: dict, cus: dict, max_set_size: int, min_set_size: int
) -> dict:
    type_w, occ_style_w, p_dress, p_outer = _occasion_tables()
    type_slot = np.array([SLOTS.index(PRODUCT_TYPES[t][0]) for t in PRODUCT_TYPES])
    customer = rng.choice(cus["n"], n_outfits, p=cus["activity"] / cus["activity"].sum())
    styles = cus["styles"][customer]

    # Occasion: base odds, shifted by how well it suits the customer's styles.
    suit = styles.astype(float) @ (occ_style_w / occ_style_w.max(axis=1, keepdims=True)).T
    base = np.array([OCCASION_BASE_ODDS[o] for o in OCCASIONS])
    occasion = _categorical(rng, base[None, :] * (1 + 2 * suit))

    # Anchor style: mostly one of the customer's styles (weighed by the occasion), else the occasion's.
    from_customer = rng.random(n_outfits) < ANCHOR_FROM_CUSTOMER
    mine = styles * (occ_style_w[occasion] + 0.5)
    anchor = np.where(from_customer, _categorical(rng, mine), _categorical(rng, occ_style_w[occasion]))

    sizes, odds = _size_odds(min_set_size, max_set_size)
    size = rng.choice(sizes, n_outfits, p=odds)
    can_dress = cus["gender"][customer] != 1
    dress = can_dress & (rng.random(n_outfits) < p_dress[occasion])
    northern = np.isin(cus["country"][customer], [COUNTRIES.index(c) for c in NORTHERN])
    outer = rng.random(n_outfits) < np.clip(p_outer[occasion] * np.where(northern, 1.3, 0.9), 0, 1)
    core = np.where(dress, 2, 3)
    outer &= size - core - 1 >= 0
    n_accessories = size - core - outer

    allowed = _cut_for(cus["gender"][customer]) & ~cus["nogo"][customer]
    weights = type_w[occasion] * allowed
    draws_outfit, draws_type = [], []
    for slot, needed in (
        ("top", ~dress),
        ("bottom", ~dress),
        ("dress", dress),
        ("shoes", np.ones(n_outfits, bool)),
        ("outerwear", outer),
    ):
        rows = np.flatnonzero(needed)
        cols = np.flatnonzero(type_slot == SLOTS.index(slot))
        draws_outfit.append(rows)
        draws_type.append(cols[_categorical(rng, weights[np.ix_(rows, cols)])])
    acc_cols = np.flatnonzero(type_slot == SLOTS.index("accessory"))
    acc = _gumbel_top_k(rng, _log(weights[:, acc_cols]), int(n_accessories.max()))
    keep = np.arange(acc.shape[1])[None, :] < n_accessories[:, None]
    draws_outfit.append(np.broadcast_to(np.arange(n_outfits)[:, None], acc.shape)[keep])
    draws_type.append(acc_cols[acc[keep]])
    draw_outfit, draw_type = np.concatenate(draws_outfit), np.concatenate(draws_type)

    article = _draw_articles(rng, draw_outfit, draw_type, customer, anchor, art, cus)
    order = np.lexsort((rng.random(len(draw_outfit)), draw_outfit))  # group by outfit, items in random order
    return dict(
        n=n_outfits, customer=customer, occasion=occasion, anchor=anchor, size=size,
        draw_outfit=draw_outfit[order], article=article[order],
    )  # fmt: skip


def _draw_articles(rng, draw_outfit, draw_type, customer, anchor, art, cus) -> np.ndarray:
    """For every (outfit, product type) draw, one article of that type, weighted as the docstring says.

    Draws are grouped by candidate pool (product type x the customer's gender). Within a pool the weights
    of a chunk of draws form one (draws, pool) matrix: the style x colour factor is a per-draw lookup table
    gathered at the pool's articles, popularity x fit a per-pool table picked by the draw's wanted fit, and
    the few preferred-brand articles are boosted in place (a customer prefers at most five brands)."""
    cust = customer[draw_outfit]
    n_colors = len(COLORS)
    # Customers see articles cut for them: women's + unisex, men's + unisex, or all (diverse).
    pool_key = draw_type * len(GENDERS) + cus["gender"][cust]
    by_key = np.argsort(pool_key, kind="stable")
    bounds = np.flatnonzero(np.diff(pool_key[by_key])) + 1
    fit_factor = np.where(np.eye(len(FITS), dtype=bool), 1.0, FIT_MISMATCH)  # [wanted fit, article fit]
    fit_factor[:, FITS.index("regular")] = np.maximum(fit_factor[:, FITS.index("regular")], FIT_REGULAR_ARTICLE)
    brand_rows, brand_cols = np.nonzero(cus["brands"])
    brand_start = np.searchsorted(brand_rows, np.arange(cus["n"] + 1))  # CSR: customer -> preferred brands
    chosen = np.empty(len(draw_outfit), dtype=np.int64)
    for group in np.split(by_key, bounds):
        t, g = divmod(int(pool_key[group[0]]), len(GENDERS))
        gender_ok = np.isin(art["gender"], (0, 2) if g == 0 else (1, 2) if g == 1 else (0, 1, 2))
        pool = np.flatnonzero((art["product_type"] == t) & gender_ok)
        slot = art["slot"][pool[0]]
        style_color = art["style"][pool] * n_colors + art["color"][pool]
        pop_fit = (art["popularity"][pool][None, :] * fit_factor[:, art["fit"][pool]]).astype(np.float32)
        price = art["price"][pool]
        # pool articles grouped by brand, to boost a draw's preferred brands in place
        pool_by_brand = np.argsort(art["brand"][pool], kind="stable")
        brand_first = np.searchsorted(art["brand"][pool][pool_by_brand], np.arange(art["n_brands"] + 1))
        step = max(1, _MAX_SAMPLING_CELLS // len(pool))
        for start in range(0, len(group), step):
            rows = group[start : start + step]
            c = cust[rows]
            style_w = np.where(cus["styles"][c], OTHER_PREFERRED_STYLE_BOOST, 1.0).astype(np.float32)
            style_w[np.arange(len(rows)), anchor[draw_outfit[rows]]] = ANCHOR_STYLE_BOOST
            color_w = np.where(cus["colors"][c], PREFERRED_COLOR_BOOST, 1.0).astype(np.float32)
            if cus["hidden_color"] is not None:
                color_w[np.arange(len(rows)), cus["hidden_color"][c]] *= cus["hidden_color_factor"]
            w = (style_w[:, :, None] * color_w[:, None, :]).reshape(len(rows), -1)[:, style_color]
            w *= pop_fit[cus["fit"][c, slot]]
            outside = (price[None, :] < cus["price_min"][c, None]) | (price[None, :] > cus["price_max"][c, None])
            w *= np.where(outside, np.float32(OUT_OF_PRICE_RANGE), np.float32(1.0))
            r, cols = _preferred_brand_cells(c, brand_start, brand_cols, brand_first, pool_by_brand)
            w[r, cols] *= PREFERRED_BRAND_BOOST
            if cus["hidden_brand"] is not None:
                hidden = art["brand"][pool][None, :] == cus["hidden_brand"][c][:, None]
                w *= np.where(hidden, cus["hidden_brand_factor"], np.float32(1.0))
            cum = np.cumsum(w, axis=1)
            u = rng.random(len(rows)) * cum[:, -1]
            chosen[rows] = pool[np.minimum((cum < u[:, None]).sum(axis=1), len(pool) - 1)]
    return chosen


def _preferred_brand_cells(c, brand_start, brand_cols, brand_first, pool_by_brand):
    """(row, pool column) of every pool article whose brand the row's customer prefers."""
    n_pref = brand_start[c + 1] - brand_start[c]
    row_of_pref = np.repeat(np.arange(len(c)), n_pref)
    pref = brand_cols[np.repeat(brand_start[c], n_pref) + _ranges(n_pref)]
    n_cells = brand_first[pref + 1] - brand_first[pref]
    cols = pool_by_brand[np.repeat(brand_first[pref], n_cells) + _ranges(n_cells)]
    return np.repeat(row_of_pref, n_cells), cols


def _ranges(lengths: np.ndarray) -> np.ndarray:
    """Concatenated aranges: [0..lengths[0]), [0..lengths[1]), ..."""
    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(total) - starts


# --- tables ------------------------------------------------------------------------------------------


def _tables(art: dict, cus: dict, out: dict) -> dict[str, pa.Table]:
    article_id = _ids("A", art["n"], 7)
    customer_id = _ids("C", cus["n"], 7)
    type_names = np.array(list(PRODUCT_TYPES), dtype=object)
    brand_names = _ids("brand_", art["n_brands"], 4)
    obj = lambda values: np.asarray(values, dtype=object)  # noqa: E731
    articles = pa.table(
        {
            "article_id": pa.array(article_id, pa.string()),
            "product_type": pa.array(type_names[art["product_type"]], pa.string()),
            "brand": pa.array(brand_names[art["brand"]], pa.string()),
            "color": pa.array(obj(COLORS)[art["color"]], pa.string()),
            "style": pa.array(obj(STYLES)[art["style"]], pa.string()),
            "price": pa.array(art["price"], pa.float64()),
            "category": pa.array(obj(SLOTS)[art["slot"]], pa.string()),
            "gender": pa.array(obj(("women", "men", "unisex"))[art["gender"]], pa.string()),
            "fit": pa.array(obj(FITS)[art["fit"]], pa.string()),
        }
    )
    customers = pa.table(
        {
            "customer_id": pa.array(customer_id, pa.string()),
            "age": pa.array(cus["age"], pa.float64()),
            "gender": pa.array(obj(GENDERS)[cus["gender"]], pa.string()),
            "country": pa.array(obj(COUNTRIES)[cus["country"]], pa.string()),
            "preferred_brands": _list_column(cus["brands"], brand_names),
            "preferred_colors": _list_column(cus["colors"], COLORS),
            "preferred_styles": _list_column(cus["styles"], STYLES),
            "nogo_product_types": _list_column(cus["nogo"], type_names),
            "size_top": pa.array(obj(TOP_SIZES)[cus["top_size"]], pa.string()),
            "size_bottom": pa.array(obj(BOTTOM_SIZES)[cus["bottom_size"]], pa.string()),
            "size_shoes": pa.array(obj(SHOE_SIZES)[cus["shoe_size"]], pa.string()),
            "price_min": pa.array(cus["price_min"], pa.float64()),
            "price_max": pa.array(cus["price_max"], pa.float64()),
        }
    )
    offsets = np.concatenate([[0], np.cumsum(np.bincount(out["draw_outfit"], minlength=out["n"]))]).astype(np.int32)
    outfits = pa.table(
        {
            "outfit_id": pa.array(_ids("O", out["n"], 8), pa.string()),
            "customer_id": pa.array(customer_id[out["customer"]], pa.string()),
            "article_ids": pa.ListArray.from_arrays(
                pa.array(offsets), pa.array(article_id[out["article"]], pa.string())
            ),
            "occasion": pa.array(obj(OCCASIONS)[out["occasion"]], pa.string()),
            DATE_COLUMN: pa.array(out["date"], DATE_TYPE),
        }
    )
    return {"articles": articles, "customers": customers, "outfits": outfits}


def planted_signal(art: dict, cus: dict, out: dict) -> dict[str, float]:
    """How strongly the context shows in the outfits: shares of items matching the customer's preferences,
    next to the share expected if articles were drawn by popularity alone. No-go items must be 0."""
    cust = out["customer"][out["draw_outfit"]]
    item = out["article"]
    pop = art["popularity"] / art["popularity"].sum()

    def share(mask_items: np.ndarray) -> float:
        return round(float(mask_items.mean()), 4)

    def expected(prefs: np.ndarray, article_attr: np.ndarray) -> float:
        # P(a popularity-drawn article has a preferred attribute), averaged over the outfit items' customers
        per_customer = prefs.astype(np.float64) @ np.bincount(article_attr, pop, prefs.shape[1])
        return round(float(per_customer[cust].mean()), 4)

    return {
        "items_in_preferred_style": share(cus["styles"][cust, art["style"][item]]),
        "by_popularity_alone_style": expected(cus["styles"], art["style"]),
        "items_of_preferred_brand": share(cus["brands"][cust, art["brand"][item]]),
        "by_popularity_alone_brand": expected(cus["brands"], art["brand"]),
        "items_of_preferred_color": share(cus["colors"][cust, art["color"][item]]),
        "by_popularity_alone_color": expected(cus["colors"], art["color"]),
        "items_in_price_range": share(
            (art["price"][item] >= cus["price_min"][cust]) & (art["price"][item] <= cus["price_max"][cust])
        ),
        "items_of_nogo_type": share(cus["nogo"][cust, art["product_type"][item]]),
    }


def generate(
    size: GeneratorSize,
    seed: int,
    out_dir: Path,
    max_set_size: int = ModelConfig().max_set_size,
    min_set_size: int = IngestConfig().min_set_size,
    customer_taste_strength: float = GenerateConfig().customer_taste_strength,
) -> dict:
    """Write articles/customers/outfits.parquet, schema.json and ingest_report.json into out_dir."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    art = _make_articles(rng, size.n_articles)
    cus = _make_customers(rng, size.n_customers, art)
    cus |= _hidden_tastes(np.random.default_rng([seed, TASTE_STREAM]), cus["n"], art, customer_taste_strength)
    out = _make_outfits(rng, size.n_outfits, art, cus, max_set_size, min_set_size)
    out["date"] = _dates(np.random.default_rng([seed, DATE_STREAM]), out["n"])
    tables = _tables(art, cus, out)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        pq.write_table(table, out_dir / f"{name}.parquet")
    PAPER_SCHEMA.save(out_dir)
    report = {
        "source": "synthetic",
        "seed": seed,
        "size": size.model_dump(),
        "rows": {name: table.num_rows for name, table in tables.items()},
        "n_brands": art["n_brands"],
        "items_per_outfit": round(float(len(out["article"]) / out["n"]), 3),
        "planted_signal": planted_signal(art, cus, out),
        "customer_taste_strength": customer_taste_strength,
    }
    (out_dir / "ingest_report.json").write_text(json.dumps(report, indent=2))
    # the time is returned, not written: data/raw stays byte-identical for the same settings (DVC's hash)
    return {**report, "seconds": round(time.perf_counter() - started, 2)}


def ingest(cfg, source=None) -> dict:
    """The `synthetic` entry of sources.SOURCES (it reads no files: `source` is unused)."""
    return generate(
        cfg.generate.chosen,
        seed=cfg.generate.seed,
        out_dir=cfg.paths.raw_dir,
        max_set_size=cfg.model.max_set_size,
        min_set_size=cfg.ingest.min_set_size,
        customer_taste_strength=cfg.generate.customer_taste_strength,
    )


def schema(cfg) -> DataSchema:
    """The context columns of the `synthetic` source (sources.SOURCES)."""
    return PAPER_SCHEMA


def inputs(cfg) -> list:
    """The files the `synthetic` source reads (sources.SOURCES): none."""
    return []
