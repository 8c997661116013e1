"""The core.

The RL stage's roles (rollout, scoring, learning), their coordination, state and look-back; no
prefect, mlflow or vllm at import.
"""

# hindsight's top-level packages, kept here only: the stage cache hashes those a stage runs, the
# reward loader refuses a user's folder of the same name, and a test holds pyproject.toml's
# package list and import-linter's root packages to it
PACKAGES = ("hindsight", "rewards", "tracking", "tasks", "flows", "cli")


def __getattr__(name: str):
    """`hindsight.run(...)`, the Python API (cli/api.py). Looked up on first use, so importing the
    core still imports no prefect or mlflow; the API sits above the flows, as the command does."""
    if name == "run":
        from importlib import import_module

        return import_module("cli.api").run
    raise AttributeError(f"module 'hindsight' has no attribute {name!r}")
