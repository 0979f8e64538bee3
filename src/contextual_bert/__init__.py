"""Contextual BERT for personalized outfit completion (Denk & Peleteiro Ramallo, 2020)."""

from contextual_bert import analytics

analytics.off()  # before mlflow, great_expectations, dvc or prefect is imported by anything of ours

__version__ = "0.1.0"

# The public API: these modules, whose names are public but for a leading underscore, and the subpackages, each
# with its own `__all__`. studies/ and benchmarks/ import nothing else (tests/test_studies.py;
# docs/architecture.md).
__all__ = [
    "__version__",
    "cli",
    "config",
    "cpu_kernels",
    "devices",
    "errors",
    "names",
    "data",
    "evaluation",
    "model",
    "registry",
    "serving",
    "training",
]
