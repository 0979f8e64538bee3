"""Planted data, whose exact optimum is known: the two stories (`tastes.py`, the default; `closets.py`) and their
Bayes-optimal predictor (`optimum.py`). The `planted` source (`data/sources/planted.py`) writes a story; the
optimum stage (`evaluation/optimum.py`) scores its predictor on the features."""
