"""Each reward's failure rate is logged per step, and a reward failing on rl.scoring.failure_stop of
a step's completions stops the run with its own error, its fallback scores never trained on."""
import pytest

from hindsight.coordination.run import RLRun
from hindsight.errors import RewardError
from tests.helpers import rl_cfg, tiny_init


@pytest.fixture()
def init(tmp_path):
    return tiny_init(tmp_path)


def test_the_failure_rate_is_logged_and_a_reward_under_the_share_does_not_stop(tmp_path, init):
    run = RLRun(rl_cfg(tmp_path, rewards=[{"fn": "helpers:half_fail"}]), init, None)
    try:
        run.rollout(0)
        _, metrics = run.score(0)
    finally:
        run.close()
    assert metrics["reward/failures/half_fail"] == 8.0 and metrics["reward/failure_rate/half_fail"] == 0.5


def test_a_reward_failing_on_the_share_stops_and_its_scores_are_dropped(tmp_path, init):
    run = RLRun(rl_cfg(tmp_path, rewards=[{"fn": "helpers:varied"}, {"fn": "helpers:half_fail"}],
                       scoring={"failure_stop": 0.5}), init, None)
    try:
        run.rollout(0)
        with pytest.raises(RewardError, match=r"step 0: reward half_fail failed on 8 of 16 completions "
                                              r"\(rl.scoring.failure_stop 0.5\): returned None \(not a finite number\)"):
            run.score(0)
        assert not run.store.has("scores", 0) and not run.store.with_parts("scores", 0, list(range(4)))
    finally:
        run.close()
