"""The pyfunc model logged from code: MLflow executes this file when it loads the model.

Only `serving.log_pyfunc_model` refers to it; importing it elsewhere would register a model as a side effect.
"""

import mlflow.models

from contextual_bert.serving.completer import OutfitCompleter

mlflow.models.set_model(OutfitCompleter())
