"""Registered models as MLflow Models: loading, serving and batch prediction."""
