"""Commands started together on a new SQLite tracking store (two pipelines at once) all open it:
MLflow creates the tables and runs its migrations when a store is opened, and without
`tracking.store._one_opener` most of four such processes failed (`table metrics already exists`,
alembic's `Online migration expected to match one row`)."""
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]


def test_four_commands_opening_a_new_sqlite_store_at_once_all_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = ("from tracking import client_for\n"
            f"c = client_for({uri!r})\n"
            "c.search_experiments()\n"
            "c.search_registered_models()\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [e[-800:] for e in errors]
    client = MlflowClient(uri)
    assert [e.name for e in client.search_experiments()] == ["Default"]
    client.create_experiment("usable")  # the schema is whole: the store takes writes
