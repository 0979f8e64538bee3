"""Contextual BERT for personalized outfit completion (Denk & Peleteiro Ramallo, 2020)."""

from contextual_bert import analytics

analytics.off()  # before mlflow, great_expectations, dvc or prefect is imported by anything of ours

__version__ = "0.1.0"
