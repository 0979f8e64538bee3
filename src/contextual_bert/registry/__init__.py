"""MLflow: each training's run (tracking.py), the model registry (models.py) and promotion (promotion.py)."""
