"""Prefect flows: each stage reads like its story; the pipeline chains them."""
