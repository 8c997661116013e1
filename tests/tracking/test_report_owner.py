"""`hindsight report RUN` follows a run's `hindsight.run_dir` tag only into a folder that records
that run: a crafted tag cannot point it at another run's directory."""
import pytest
from mlflow.tracking import MlflowClient

from hindsight.errors import ConfigError
from tracking.lookback import run_dir_of


def test_a_tag_pointing_at_a_folder_that_does_not_record_the_run_is_refused(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    mine, other = client.create_run(exp).info.run_id, client.create_run(exp).info.run_id
    (tmp_path / "own" / "rl").mkdir(parents=True)
    (tmp_path / "own" / "rl" / "mlflow_run_ids").write_text(f"{mine}\n")
    (tmp_path / "victim" / "rl").mkdir(parents=True)
    (tmp_path / "victim" / "rl" / "mlflow_run_ids").write_text("someone-else\n")
    client.set_tag(mine, "hindsight.run_dir", str(tmp_path / "own"))
    client.set_tag(other, "hindsight.run_dir", str(tmp_path / "victim"))
    assert run_dir_of(client, mine) == tmp_path / "own"
    with pytest.raises(ConfigError, match=r"which does not record that run \(rl/mlflow_run_ids\); refusing to read it"):
        run_dir_of(client, other)
