"""Serving: the outfit completer (completer.py) and the MLflow pyfunc model that wraps it.

The public API is `__all__`: the names studies/ and users import from here (tests/test_studies.py). Those
from other modules are exported lazily (`contextual_bert.lazy`).
"""

from typing import TYPE_CHECKING

from contextual_bert.lazy import lazy_exports

if TYPE_CHECKING:
    from contextual_bert.serving.completer import (
        PARALLEL_ROWS,
        OutfitCompleter,
        OutfitCompleterCore,
        example_request,
        log_pyfunc_model,
        serving_threads,
    )

_PUBLIC = {  # a lazily exported name: its module in this package
    "OutfitCompleter": "completer",
    "OutfitCompleterCore": "completer",
    "example_request": "completer",
    "log_pyfunc_model": "completer",
    "PARALLEL_ROWS": "completer",
    "serving_threads": "completer",
}
__all__ = list(_PUBLIC)

__getattr__ = lazy_exports(__name__, _PUBLIC, globals())
