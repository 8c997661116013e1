"""Prefect tasks: caching, retries, I/O and MLflow logging around the pure core. No maths here."""
