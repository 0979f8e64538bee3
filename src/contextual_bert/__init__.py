"""Contextual BERT for personalized outfit completion (Denk & Peleteiro Ramallo, 2020)."""

__version__ = "0.1.0"
