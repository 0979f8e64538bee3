"""MLflow: each training's run (tracking.py), the model registry (models.py) and promotion (promotion.py).

The public API is `__all__`: the names studies/ and users import from here (tests/test_studies.py). Those
from other modules are exported lazily: a name's module is imported at its first use (PEP 562 `__getattr__`), so
that importing the package runs no module it does not need (dvc.yaml's code deps follow the static import graph,
tests/test_dvc_stage_deps.py); mypy reads them under `if TYPE_CHECKING:`.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from contextual_bert.registry.models import register_all
    from contextual_bert.registry.promotion import promote, rollback
    from contextual_bert.registry.tracking import client, experiment_id, tracking_uri

_PUBLIC = {  # a lazily exported name: its module in this package
    "register_all": "models",
    "promote": "promotion",
    "rollback": "promotion",
    "client": "tracking",
    "experiment_id": "tracking",
    "tracking_uri": "tracking",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str) -> object:
    """A public name of `_PUBLIC`, imported from its module at its first use and kept here."""
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    globals()[name] = value
    return value
