"""A user's reward module beside the config (the design's `my_rewards.math_reward` in the user's
folder) imports with no PYTHONPATH once the config is loaded, in this process and in the
reward worker it spawns; hindsight's own `rewards` package keeps its name."""
from __future__ import annotations

import sys
from pathlib import Path

from hindsight.config import load_config
from hindsight.scoring.guarded import RewardWorker
from hindsight.scoring.rewards import score_completions

REWARD = "def score(completions, answer, **_):\n    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n"


def test_a_reward_module_beside_the_config_imports_in_the_worker_too(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    (folder / "my_rewards").mkdir(parents=True)
    (folder / "my_rewards" / "math_reward.py").write_text(REWARD)  # a namespace package, as users write it
    (folder / "rl.yaml").write_text("rl:\n  scoring:\n    rewards:\n      - {fn: 'my_rewards.math_reward:score'}\n")
    monkeypatch.chdir(tmp_path)  # not the config's folder: nothing else puts it on the path
    monkeypatch.setattr(sys, "path", list(sys.path))
    cfg = load_config(folder / "rl.yaml")
    worker = RewardWorker()
    try:
        res = score_completions([(cfg.rl.scoring.rewards[0].fn, 1.0), ("rewards.exact:exact_answer", 1.0)],
                                ["7", "8"], {"answer": ["7", "7"]}, fallback=-1.0, worker=worker, timeout_s=60)
    finally:
        worker.close()
    assert res.total == [2.0, 0.0] and res.failures == {"score": 0, "exact_answer": 0}
    assert sys.modules["rewards"].__file__.endswith("rewards/__init__.py")  # hindsight's own, still


def test_another_checkout_of_hindsight_on_the_path_is_not_a_users_folder(tmp_path, monkeypatch):
    import shutil

    import rewards
    from hindsight.scoring.reward_fns import shadowed

    ours = sys.modules["rewards"].__file__
    clone = tmp_path / "clone"
    shutil.copytree(Path(ours).parent, clone / "rewards")  # an editable install of one clone, PYTHONPATH on another
    user = tmp_path / "user"
    (user / "rewards").mkdir(parents=True)
    (user / "rewards" / "exact.py").write_text(REWARD)  # the user's own folder of that name
    monkeypatch.setattr(sys, "path", [*sys.path, str(clone)])
    assert rewards is sys.modules["rewards"] and shadowed("rewards.exact:exact_answer", "rewards.exact") is None
    monkeypatch.setattr(sys, "path", [*sys.path, str(user)])
    assert "is your own folder" in shadowed("rewards.exact:exact_answer", "rewards.exact")
