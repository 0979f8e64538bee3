"""A customer's history: the rule for which earlier outfits an outfit may see.

The one rule (features, the optimum and the yardsticks all read it from here): an outfit's history is the
outfits of the same customer dated strictly earlier (`history_items`: their articles as often as worn, the
most worn first). Never the outfit itself, never a later
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
    """Per outfit, the articles of its history outfits, each once per history outfit that holds it (how often
    the customer wore it), the most worn first and among equals the most recently worn, in at most `max_items`
    slots (the least worn left out). `items`: the article ids of every row. Why counts: a customer's re-worn
    articles are what their next outfit repeats, and the most recent outfits' articles, each once, cannot tell
    them from one-offs (studies/history_counts).

    A customer's history lists (earlier_outfits) are the tails of one list, the customer's eligible outfits most
    recent first: so they are counted once per customer, from the oldest outfit on, not once per outfit."""
    out: list[list] = [[] for _ in history_rows]
    customers: dict[int, list[int]] = {}
    for i, rows in enumerate(history_rows):
        if len(rows):
            customers.setdefault(int(rows[-1]), []).append(i)  # the same oldest outfit: the same customer
    for members in customers.values():
        members.sort(key=lambda i: len(history_rows[i]))
        worn: dict = {}
        age: dict = {}  # where the article is last listed: (minus its outfit's count from the oldest, its place)
        counted = 0
        for i in members:
            rows = history_rows[i]
            for row in rows[: len(rows) - counted][::-1]:  # the outfits not yet counted, oldest first
                counted += 1
                for place, article in enumerate(dict.fromkeys(items[row])):
                    worn[article] = worn.get(article, 0) + 1
                    age[article] = (-counted, place)
            out[i] = history_slots(worn, age, max_items)
    return out


def history_slots(worn: dict, age: dict, max_items: int) -> list:
    """The history feature's slots: each article as often as `worn` (article -> how many history outfits hold
    it), the most worn first, among equals the most recently listed (the smaller `age`: its first place in the
    history listed the most recent outfit first), at most `max_items`."""
    slots: list = []
    for article in sorted(worn, key=lambda a: (-worn[a], age[a])):
        if len(slots) >= max_items:
            break
        slots += [article] * min(worn[article], max_items - len(slots))
    return slots


def listed_history(article_ids: list, max_items: int) -> list:
    """history_slots of a history listed as a client lists it (serving, promotion): each earlier outfit's
    articles, the most recent outfit first, so that an article is listed once per outfit that held it."""
    worn: dict = {}
    age: dict = {}
    for position, article in enumerate(article_ids):
        worn[article] = worn.get(article, 0) + 1
        age.setdefault(article, position)
    return history_slots(worn, age, max_items)
