"""MLflow: each training's run (tracking.py), the model registry (models.py), a registered version's files
checked against their digest (integrity.py) and promotion (promotion.py).

The public API is `__all__`: the names studies/ and users import from here (tests/test_studies.py). Those
from other modules are exported lazily (`contextual_bert.lazy`).
"""

from typing import TYPE_CHECKING

from contextual_bert.lazy import lazy_exports

if TYPE_CHECKING:
    from contextual_bert.registry.integrity import IntegrityError, verified_copy, version_files_uri
    from contextual_bert.registry.models import register_all
    from contextual_bert.registry.promotion import CHAMPION, move_champion, promote, rollback
    from contextual_bert.registry.tracking import client, experiment_id, track_training, tracking_uri

_PUBLIC = {  # a lazily exported name: its module in this package
    "IntegrityError": "integrity",
    "verified_copy": "integrity",
    "version_files_uri": "integrity",
    "register_all": "models",
    "CHAMPION": "promotion",
    "move_champion": "promotion",
    "promote": "promotion",
    "rollback": "promotion",
    "client": "tracking",
    "experiment_id": "tracking",
    "track_training": "tracking",
    "tracking_uri": "tracking",
}
__all__ = list(_PUBLIC)

__getattr__ = lazy_exports(__name__, _PUBLIC, globals())
