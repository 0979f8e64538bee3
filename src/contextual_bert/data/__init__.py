"""Data: the sources (generated, planted, H&M, curated sets) and their contract, validation, and the features
stage (vocabulary, context tables, splits, history) with its store."""
