"""The names every layer shares: the models (the paper's five variants and ours beside them, the learned
baselines, their `_attrs` twins) and the files of a run's directory. `config.py` validates settings against them."""

from __future__ import annotations

PAPER_VARIANTS = ("none", "concat", "new_position", "global_state", "global_state_update")  # the paper's five
# Conditioning variants of our own beside the paper's (model/encoder.py), trained only where train.models lists
# them (docs/decisions.md): [GS2], the global state that also reads the outfit (issue 70); [AdaLN], adaLN-Zero,
# c scales, shifts and gates every block's sublayers (issue 89)
OWN_VARIANTS = ("global_state_two_way", "adaptive_norm")
VARIANTS = PAPER_VARIANTS + OWN_VARIANTS  # every conditioning variant of the encoder
BASELINE_MODELS = ("bag_of_items", "bag_of_items_context")  # learned baselines, trained by the same code
CONTEXT_FREE = ("none", "bag_of_items")  # the models that read no customer context (and their "_attrs" twins)
NOT_APPLICABLE = "not_applicable"  # a run's metrics.json key: this data cannot train the model, and why
# A run directory's files (Config.run_dir): the best checkpoint, the resume state, the training curve (a row per
# epoch) and the run's result
CHECKPOINT_FILE, LAST_FILE, CURVE_FILE, METRICS_FILE = "checkpoint.pt", "last.pt", "curve.json", "metrics.json"
# Every model again with article attributes (issue 14): "<model>_attrs" reads the catalogue's attributes
# (features.article_attributes) beside the article ids. Named models of their own, so DVC matrix keys, run
# directories, reports and MLflow runs never mix them with the paper's rows.
ATTRIBUTES_SUFFIX = "_attrs"
ATTRIBUTE_MODELS = tuple(m + ATTRIBUTES_SUFFIX for m in VARIANTS + BASELINE_MODELS)
MODELS = VARIANTS + BASELINE_MODELS + ATTRIBUTE_MODELS


def uses_attributes(model: str) -> bool:
    """Does this model name read article attributes ("<model>_attrs")?"""
    return model.endswith(ATTRIBUTES_SUFFIX)


def base_model(model: str) -> str:
    """The paper variant or learned baseline a model name is built on ("none_attrs" -> "none")."""
    return model[: -len(ATTRIBUTES_SUFFIX)] if uses_attributes(model) else model
