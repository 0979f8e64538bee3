"""Evaluation: ranking every case of a split, the evaluate and baseline stages, fill-in-the-blank, the planted
data's optimum, confidence intervals, and the report (Table 1).

The public API is `__all__`: the names studies/ and users import from here (tests/test_studies.py). Those
from other modules are exported lazily (`contextual_bert.lazy`).
"""

from typing import TYPE_CHECKING

from contextual_bert.lazy import lazy_exports

if TYPE_CHECKING:
    from contextual_bert.evaluation.bootstrap import (
        KNOWN_OUTFITS_KEY,
        OUTFITS_KEY,
        bootstrap_ci,
        case_values,
        mean_record,
        outfit_record,
        paired_difference,
    )
    from contextual_bert.evaluation.counts import HISTORY_WEIGHTS
    from contextual_bert.evaluation.evaluate import (
        attribute_popularity_model,
        evaluate_attribute_popularity,
        evaluate_model,
        evaluate_popularity,
        evaluate_run,
        evaluate_split,
        yardstick_model,
    )
    from contextual_bert.evaluation.fitb import PROTOCOLS, answer, split_questions
    from contextual_bert.evaluation.optimum import optimum_from_features
    from contextual_bert.evaluation.ranking import case_ranks, donor_outfits
    from contextual_bert.evaluation.report_stats import compare, compare_models, mean_se, summarize_runs
    from contextual_bert.evaluation.table1 import LABELS

_PUBLIC = {  # a lazily exported name: its module in this package
    "KNOWN_OUTFITS_KEY": "bootstrap",
    "OUTFITS_KEY": "bootstrap",
    "bootstrap_ci": "bootstrap",
    "case_values": "bootstrap",
    "mean_record": "bootstrap",
    "outfit_record": "bootstrap",
    "paired_difference": "bootstrap",
    "HISTORY_WEIGHTS": "counts",
    "attribute_popularity_model": "evaluate",
    "evaluate_attribute_popularity": "evaluate",
    "evaluate_model": "evaluate",
    "evaluate_popularity": "evaluate",
    "evaluate_run": "evaluate",
    "evaluate_split": "evaluate",
    "yardstick_model": "evaluate",
    "PROTOCOLS": "fitb",
    "answer": "fitb",
    "split_questions": "fitb",
    "optimum_from_features": "optimum",
    "case_ranks": "ranking",
    "donor_outfits": "ranking",
    "compare": "report_stats",
    "compare_models": "report_stats",
    "mean_se": "report_stats",
    "summarize_runs": "report_stats",
    "LABELS": "table1",
}
__all__ = list(_PUBLIC)

__getattr__ = lazy_exports(__name__, _PUBLIC, globals())
