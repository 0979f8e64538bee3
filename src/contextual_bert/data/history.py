"""A customer's history: the rule for which earlier outfits an outfit may see.

The one rule (features, the optimum and the yardsticks all read it from here): an outfit's history is the
outfits of the same customer dated strictly earlier, most recent first. Never the outfit itself, never a later
one, never another outfit of the same date (a day's baskets are one visit: one of them must not explain
another). Only outfits marked `eligible` are history: under the hash split the train outfits only, so no
validation or test outfit's articles are ever a training input; under the time split every outfit, since
all of them lie before the outfit that reads them and none of the training outfits' histories reaches into
the later periods. An outfit without a customer or a date has no history.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def earlier_outfits(customer_ids, dates, eligible=None) -> list[np.ndarray]:
    """Per outfit (row), the rows of its history, most recent first (within a day by row).

    customer_ids: one per row (None / NaN: no customer); dates: one per row (datetime-like or NaT);
    eligible: bool per row, which rows may be someone's history (default: all). Vectorized: one sort and two
    binary searches, so it runs at H&M's full size.
    """
    n = len(customer_ids)
    customer, _ = pd.factorize(pd.Series(customer_ids, dtype=object), use_na_sentinel=True)
    day = pd.to_datetime(pd.Series(dates).reset_index(drop=True)).to_numpy("datetime64[D]")
    known = (customer >= 0) & ~np.isnat(day)
    ok = known & (np.ones(n, bool) if eligible is None else np.asarray(eligible, bool))
    day_number = np.where(known, day.astype("int64", copy=False), 0)
    span = int(day_number.max() - day_number.min() + 2) if n else 1
    # key: customer, then later days first; the eligible rows sorted by it (then by row)
    key = customer.astype(np.int64) * span + (day_number.max(initial=0) - day_number)
    pool = np.flatnonzero(ok)
    pool = pool[np.lexsort((pool, key[pool]))]
    pool_key = key[pool]
    start = np.searchsorted(pool_key, key, side="right")  # the first eligible row of the customer, earlier day
    end = np.searchsorted(pool_key, (customer.astype(np.int64) + 1) * span, side="left")
    return [pool[s:e] if k else np.empty(0, np.int64) for s, e, k in zip(start, end, known)]


def eligible_rows(split, split_rule: str) -> np.ndarray:
    """Which outfits may be someone's history (module docstring): every one under features.split "time", the
    train outfits under "hash"."""
    if split_rule not in ("hash", "time"):
        raise ValueError(f"features.split '{split_rule}' is not hash or time")
    return np.ones(len(split), bool) if split_rule == "time" else np.asarray(split) == "train"


def history_items(history_rows: list[np.ndarray], items: list, max_items: int) -> list[list]:
    """Per outfit, the article ids of its history outfits, most recent outfit first, each article once (its
    most recent appearance), at most `max_items`. `items`: the article ids of every row."""
    out = []
    for rows in history_rows:
        seen: dict = {}
        for row in rows:
            for article in items[row]:
                if article not in seen:
                    seen[article] = None
                    if len(seen) == max_items:
                        break
            if len(seen) == max_items:
                break
        out.append(list(seen))
    return out
