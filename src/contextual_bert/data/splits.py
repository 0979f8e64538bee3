"""The features stage's splits: by a keyed hash of the outfit id, or by time (the earliest outfits train)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

from contextual_bert.data.contract import DATE_COLUMN
from contextual_bert.errors import DataError


def split_fractions(outfit_ids, seed: int) -> np.ndarray:
    """A number in [0, 1) per outfit id, from a keyed BLAKE2b hash: stable across runs, machines and rows."""
    key = int(seed).to_bytes(8, "little", signed=True)
    hashes = np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(str(i).encode(), digest_size=8, key=key).digest(), "little")
            for i in outfit_ids
        ),
        dtype=np.uint64,
        count=len(outfit_ids),
    )
    return hashes.astype(np.float64) / 2.0**64


def assign_splits(outfit_ids, val_fraction: float, test_fraction: float, seed: int) -> np.ndarray:
    """'train' / 'val' / 'test' per outfit id (see the module docstring)."""
    u = split_fractions(outfit_ids, seed)
    return np.where(u < test_fraction, "test", np.where(u < test_fraction + val_fraction, "val", "train"))


def assign_time_splits(dates, val_fraction: float, test_fraction: float) -> np.ndarray:
    """'train' / 'val' / 'test' by date: test from the day where the latest `test_fraction` of the outfits
    begins, val from the day where the `val_fraction` before them begins; a day is never cut in two, so
    every training outfit is dated before every validation one, and those before every test one."""
    day = pd.to_datetime(pd.Series(dates)).to_numpy("datetime64[D]")
    ordered = np.sort(day)
    n = len(ordered)
    test_from = ordered[min(n - 1, int(np.floor(n * (1 - test_fraction))))]
    val_from = ordered[min(n - 1, int(np.floor(n * (1 - test_fraction - val_fraction))))]
    return np.where(day >= test_from, "test", np.where(day >= val_from, "val", "train"))


def outfit_dates(outfits: pd.DataFrame, path: Path, why: str) -> pd.Series:
    """The outfits' dates, or a one-line error saying what asked for them and why there are none."""
    if DATE_COLUMN not in outfits.columns:
        raise DataError(
            f"{why} needs the outfits' dates, and this source wrote none (H&M baskets and the "
            "generators date every outfit; curated sets need import_sets.date_column)",
            path=path,
            column=DATE_COLUMN,
        )
    dates = pd.to_datetime(outfits[DATE_COLUMN])
    if dates.isna().any():
        row = int(np.flatnonzero(dates.isna().to_numpy())[0])
        raise DataError("an outfit has no date (validate quarantines these)", path=path, row=row, column=DATE_COLUMN)
    return dates
