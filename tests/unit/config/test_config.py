from pathlib import Path

import pytest

from hindsight.config import flatten, load_config
from hindsight.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


PIPELINES = [p for p in sorted(ROOT.glob("configs/**/*.yaml")) if "accelerate" not in p.parts and "sweep" not in p.name]


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    cfg = load_config(path)
    assert cfg.name


@pytest.mark.parametrize("path", sorted(ROOT.glob("configs/sweep*.yaml")), ids=lambda p: p.name)
def test_every_shipped_sweep_validates_with_its_trials(path):
    from hindsight.config.sweep import load_sweep, trial_config, trial_params

    sweep, base, _ = load_sweep(path)
    trials = [trial_config(sweep, base, i, p, path) for i, p in enumerate(trial_params(sweep))]
    assert len(trials) >= 4 and len({t.root for t in trials}) == len(trials)


@pytest.mark.parametrize("path", sorted(ROOT.glob("configs/accelerate/*.yaml")), ids=lambda p: p.name)
def test_accelerate_examples_are_accelerate_configs(path):
    import yaml
    from accelerate.commands.config.config_args import ClusterConfig

    ClusterConfig(**yaml.safe_load(path.read_text()))  # accelerate's own schema: an unknown key raises


def _write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_unknown_key_names_file_line_and_field(tmp_path):
    p = _write(tmp_path, "name: x\nrl:\n  steps: 3\n  stepz: 4\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert f"{p}:4: rl.stepz: unknown key" in str(err.value)


def test_wrong_type_names_field(tmp_path):
    p = _write(tmp_path, "rl:\n  learner:\n    lr: fast\n")
    with pytest.raises(ConfigError, match=r"c.yaml:3: rl.learner.lr: Input should be a valid number"):
        load_config(p)


def test_out_of_range_group_size(tmp_path):
    p = _write(tmp_path, "rl:\n  samples_per_prompt: 1\n")
    with pytest.raises(ConfigError, match=r"rl.samples_per_prompt: Value error, grpo compares completions within a group, "
                                          r"so it needs at least 2"):
        load_config(p)


def test_malformed_yaml_names_line(tmp_path):
    p = _write(tmp_path, "name: x\nrl: [steps: 3\n")
    with pytest.raises(ConfigError, match=r"c.yaml:\d+: malformed YAML"):
        load_config(p)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_set_overrides_nested_keys_with_yaml_types(tmp_path):
    p = _write(tmp_path, "name: x\n")
    cfg = load_config(p, ["rl.steps=7", "rl.kl.coef=0.5", "sft.lora.enabled=true"])
    assert (cfg.rl.steps, cfg.rl.kl.coef, cfg.sft.lora.enabled) == (7, 0.5, True)
    with pytest.raises(ConfigError, match="rl.nope: unknown key"):
        load_config(p, ["rl.nope=1"])
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        load_config(p, ["rl.steps"])


def test_flatten_gives_dotted_params():
    flat = flatten(load_config(ROOT / "configs/demo.yaml"))
    assert flat["rl.kl.coef"] == "0.02" and flat["name"] == "demo"


@pytest.mark.parametrize("extra, refused", [
    ("  dynamic_sampling: {enabled: true}\n",
     "async.max_staleness >= 1 runs one sampler process; it does not combine with dynamic_sampling.enabled"),
    ("  workers: {rollout: 2}\n", "async.max_staleness >= 1 runs one sampler process; it does not combine with "
                                  "workers.rollout > 1"),
    ("  workers: {placement: ray}\n",
     "workers.placement: ray samples on Ray actors in step with the learner; it does not combine with "
     "async.max_staleness >= 1"),
])
def test_async_refuses_what_its_pool_cannot_do(tmp_path, extra, refused):
    """The refusals are the pools' capabilities (hindsight.rollout.pools), not a list of pairs."""
    path = tmp_path / "c.yaml"
    path.write_text("rl:\n  async: {max_staleness: 1}\n" + extra)
    with pytest.raises(ConfigError, match=refused.replace(".", r"\.")):
        load_config(path)
    path.write_text("rl:\n  async: {max_staleness: 0}\n" + extra)
    assert load_config(path).rl.async_.max_staleness == 0  # on-policy: all of them are fine
