"""One declaration per stage drives its cache key: a change to any input a stage declares
(config section, input model version, data version, data file, reward source, stored state)
changes the key; a change to anything else does not."""
import sys

import pytest

from flows.registry import STAGES
from hindsight.config import PipelineConfig
from hindsight.stage import cache_key, model_name, model_uri

SPECS = [s.load_spec() for s in STAGES if s.spec is not None]  # every stage with a cache key: a new one is in
SFT, RL, NEGATIVE_FT = (next(s for s in SPECS if s.name == n) for n in ("sft", "rl", "negative-ft"))

# one valid change per top-level config key
CHANGES = {
    "sft": ("sft.lr", 0.5), "reward_model": ("reward_model.lr", 0.5), "rl": ("rl.learner.lr", 0.5),
    "negative_ft": ("negative_ft.lr", 0.5), "model": ("model.dtype", "bfloat16"), "data": ("data.split", "other"),
    "eval": ("eval.limit", 7), "seed": ("seed", 3), "name": ("name", "other"), "run_dir": ("run_dir", "elsewhere"),
    "tracking": ("tracking.experiment", "other"), "retries": ("retries.count", 4),
    "resources": ("resources.accelerate_config", "x.yaml"), "lookback": ("lookback.traces_per_step", 3),
}


def _changed(cfg: PipelineConfig, dotted: str, value) -> PipelineConfig:
    raw = cfg.model_dump(by_alias=True)
    node, *path = raw, *dotted.split(".")
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return PipelineConfig.model_validate(raw)


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A reward module of our own on sys.path, so its source can change."""
    (tmp_path / "my_reward.py").write_text("def score(completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_reward", raising=False)  # another test's copy
    cfg = PipelineConfig.model_validate({"run_dir": str(tmp_path / "run"),
                                         "rl": {"scoring": {"rewards": [{"fn": "my_reward:score"}]}},
                                         "data": {"dir": str(tmp_path / "data")}})
    return tmp_path, cfg


def _key(spec, cfg, versions=None, md5="md5-a"):
    return cache_key(spec, cfg, versions or {"m": "x/1"}, md5, store="store", code="code")


def test_every_config_key_is_either_declared_or_ignored():
    assert set(CHANGES) == set(PipelineConfig.model_fields)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_declared_sections_change_the_key_and_others_do_not(spec, workspace):
    _, cfg = workspace
    base = _key(spec, cfg)
    for section, (dotted, value) in CHANGES.items():
        changed = _key(spec, _changed(cfg, dotted, value))
        if section in spec.sections:
            assert changed != base, f"{spec.name}: {dotted} is declared but does not change the key"
        else:
            assert changed == base, f"{spec.name}: {dotted} is not declared but changes the key"


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_input_versions_and_data_version_change_the_key(spec, workspace):
    _, cfg = workspace
    assert _key(spec, cfg, {"m": "x/2"}) != _key(spec, cfg, {"m": "x/1"})
    assert _key(spec, cfg, md5="md5-b") != _key(spec, cfg)


def test_editing_a_reward_outside_our_packages_reruns_rl_only(workspace):
    tmp, cfg = workspace
    before = {s.name: _key(s, cfg) for s in SPECS}
    (tmp / "my_reward.py").write_text("def score(completions, **kw):\n    return [0.5] * len(completions)\n")
    after = {s.name: _key(s, cfg) for s in SPECS}
    assert {n for n in before if before[n] != after[n]} == {"rl"}


def test_a_data_file_outside_the_dvc_dir_is_hashed(workspace):
    tmp, cfg = workspace
    prompts = tmp / "mine.jsonl"
    prompts.write_text('{"prompt": "a"}\n')
    cfg = _changed(cfg, "data.prompts", str(prompts))
    before = _key(RL, cfg)
    prompts.write_text('{"prompt": "b"}\n')
    assert _key(RL, cfg) != before and _key(SFT, cfg) == _key(SFT, cfg)


def test_negative_ft_reruns_when_new_shards_are_stored(workspace):
    from hindsight.state.store import RolloutStore

    _, cfg = workspace
    before = _key(NEGATIVE_FT, cfg)
    RolloutStore(cfg.root / "rl").write("scores", 0, [{"step": 0, "index": 0, "reward": 1.0}])
    assert _key(NEGATIVE_FT, cfg) != before
    assert _key(RL, cfg) == _key(RL, cfg)


def test_model_names_come_from_one_function():
    cfg = PipelineConfig(name="demo")
    assert [model_name(cfg, s.registers) for s in SPECS] == ["demo-sft", "demo-rm", "demo-policy", "demo-negft"]
    assert model_uri(cfg, "sft") == "models:/demo-sft@latest"
    assert RL.models(cfg)["rl.init"] == "models:/demo-sft@latest"


def test_editing_a_tool_outside_our_packages_reruns_rl(workspace):
    """A multi-turn tool's module is an input of the RL stage, beside the packages' own code: its
    source hash and the code hash are two entries of the key (one used to overwrite the other)."""
    tmp, cfg = workspace
    (tmp / "my_tools.py").write_text("def add(a: int, b: int) -> int:\n    \"\"\"Add.\"\"\"\n    return a + b\n")
    sys.modules.pop("my_tools", None)
    raw = cfg.model_dump(mode="json", by_alias=True)
    raw["rl"]["rollout"]["multi_turn"] = {"tools": ["my_tools:add"], "max_turns": 2, "max_tokens": 64}
    cfg = PipelineConfig.model_validate(raw)
    before = _key(RL, cfg)
    (tmp / "my_tools.py").write_text("def add(a: int, b: int) -> int:\n    \"\"\"Add.\"\"\"\n    return a + b + 1\n")
    assert _key(RL, cfg) != before
    assert cache_key(RL, cfg, {"m": "x/1"}, "md5-a", store="store", code="other") != _key(RL, cfg)  # and the code's
