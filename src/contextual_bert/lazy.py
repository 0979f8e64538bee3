"""A package's public names exported lazily (PEP 562): the module that defines a name is imported at its first
use, so that importing the package runs no module it does not need (dvc.yaml's code deps follow the static import
graph, tests/test_dvc_stage_deps.py). The package lists the names under `if TYPE_CHECKING:` too, for mypy."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, public: dict[str, str], namespace: dict) -> Callable[[str], object]:
    """The package's module `__getattr__`: a name of `public` (name -> its module in `package`) imported at its
    first use and kept in `namespace` (the package's globals)."""

    def __getattr__(name: str) -> object:
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{public[name]}"), name)
        namespace[name] = value
        return value

    return __getattr__
