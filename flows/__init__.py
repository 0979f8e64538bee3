"""Prefect flows that orchestrate the DVC pipeline (see flows/pipeline.py and docs/scaling.md).

Thin by design: the flows run DVC stages, i.e. `contextual-bert <stage>` commands; DVC decides what is
stale. The library (`src/contextual_bert`) never imports Prefect, so `dvc repro` never starts a server.
"""
