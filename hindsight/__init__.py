"""The core.

The RL stage's roles (rollout, scoring, learning), their coordination, state and look-back; no
prefect, mlflow or vllm at import.
"""
