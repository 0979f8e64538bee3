"""Every learned model against the count it must beat: its yardstick, and a verdict of better, level or worse.

The yardstick of a model is the baseline stage's count that knows what the model knows: the attribute-aware
popularity for the models with article attributes ("_attrs"; all targets), lifted by the customer's own history
for those whose context holds it; popularity + the customer's own history for the other models with a history;
popularity for the rest. The verdict is on test
cross-entropy, by the rule Table 1 uses for "beats": with two seeds or more, the difference must exceed its SE
(the yardstick, one deterministic count, has none); with one seed, a paired bootstrap over the test outfits
must put the whole 95% interval of the difference on one side of 0. Otherwise the two are level.
"""

from __future__ import annotations

from contextual_bert.config import uses_attributes
from contextual_bert.evaluation.bootstrap import OUTFITS_KEY, paired_difference

VERDICT_KEY = "yardstick"  # an evaluation JSON's verdict (evaluate.evaluate_run)
METRIC = "cross_entropy"


CATALOGUE_YARDSTICKS = ("popularity_attribute", "popularity_attribute_history")  # they rank the catalogue


def yardstick_of(model: str, reads_history: bool) -> str:
    """The name of the count a model is held to (module docstring)."""
    if uses_attributes(model):
        return "popularity_attribute_history" if reads_history else "popularity_attribute"
    return "popularity_history" if reads_history else "popularity"


def verdict_of(difference: float, margin: float | None = None, interval: list[float] | None = None) -> str:
    """better / level / worse for a model's cross-entropy minus its yardstick's: beyond `margin` (an SE) on
    either side, or with `interval` (the paired bootstrap's) wholly on one side of 0."""
    if interval is not None:
        low, high = interval
        return "worse" if low > 0 else "better" if high < 0 else "level"
    assert margin is not None, "a verdict needs a margin or an interval"
    return "worse" if difference > margin else "better" if -difference > margin else "level"


def run_verdict(result: dict, name: str, yardstick: dict | None) -> dict:
    """One evaluation (one seed) against its yardstick's result: the paired bootstrap over the test outfits."""
    out = {"name": name, "metric": METRIC, "model": result["test"][METRIC]}
    if yardstick is None:
        return out | {"verdict": None, "why": f"this data has no {name}"}
    out["yardstick"] = yardstick["test"][METRIC]
    if yardstick.get(OUTFITS_KEY) is None:
        return out | {
            "difference": out["model"] - out["yardstick"],
            "verdict": None,
            "why": f"the {name} result has no per-outfit cases",
        }
    paired = paired_difference(result[OUTFITS_KEY], yardstick[OUTFITS_KEY], METRIC)
    if paired["interval"] is None:
        return out | {"difference": out["model"] - out["yardstick"], "verdict": None, "why": paired["why"]}
    return out | {
        "difference": paired["difference"],
        "interval": paired["interval"],
        "rule": "paired bootstrap",
        "verdict": verdict_of(paired["difference"], interval=paired["interval"]),
    }


def summary_verdict(model: dict, model_record: dict | None, name: str, yardstick: dict) -> dict:
    """A model's mean over seeds (report.summarize_runs' `test` entry and its mean per-outfit record) against its
    yardstick: the SE with two seeds or more, else the paired bootstrap."""
    stat = model[METRIC]
    out = {"name": name, "metric": METRIC, "model": stat["mean"], "yardstick": yardstick["test"][METRIC]}
    difference = stat["mean"] - out["yardstick"]
    if stat.get("se") is not None:
        return out | {
            "difference": difference,
            "se": stat["se"],
            "rule": "se",
            "verdict": verdict_of(difference, margin=stat["se"]),
        }
    if model_record is None:
        return out | {"difference": difference, "verdict": None, "why": "n=1, no per-outfit cases"}
    if yardstick.get(OUTFITS_KEY) is None:
        return out | {"difference": difference, "verdict": None, "why": f"the {name} result has no per-outfit cases"}
    paired = paired_difference(model_record, yardstick[OUTFITS_KEY], METRIC)
    if paired["interval"] is None:
        return out | {"difference": difference, "verdict": None, "why": paired["why"]}
    return out | {
        "difference": paired["difference"],
        "interval": paired["interval"],
        "rule": "paired bootstrap",
        "verdict": verdict_of(paired["difference"], interval=paired["interval"]),
    }
