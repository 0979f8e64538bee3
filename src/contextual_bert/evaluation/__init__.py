"""Evaluation: ranking every case of a split, the evaluate and baseline stages, fill-in-the-blank, the planted
data's optimum, confidence intervals, and the report (Table 1)."""
