"""Serving: the outfit completer (completer.py) and the MLflow pyfunc model that wraps it."""
