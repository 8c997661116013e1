"""A config's `smoke:` block: applied by --smoke before the --set overrides, never part of the
config itself, and a bad or absent preset is one error naming the file."""
import pytest

from hindsight.config import load_config
from hindsight.errors import ConfigError


def _cfg(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_the_preset_applies_only_with_smoke_and_a_set_wins_over_it(tmp_path):
    path = _cfg(tmp_path, "name: p\nrl: {steps: 40}\nsmoke: {rl.steps: 2, eval.limit: 4}\n")
    assert load_config(path).rl.steps == 40
    small = load_config(path, smoke=True)
    assert (small.rl.steps, small.eval.limit) == (2, 4)
    assert load_config(path, ["rl.steps=3"], smoke=True).rl.steps == 3


def test_a_missing_or_malformed_preset_is_one_error_naming_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"c.yaml: no `smoke:` preset"):
        load_config(_cfg(tmp_path, "name: p\n"), smoke=True)
    with pytest.raises(ConfigError, match=r"c.yaml:2: smoke: a mapping"):
        load_config(_cfg(tmp_path, "name: p\nsmoke: [1, 2]\n"))
    with pytest.raises(ConfigError, match=r"rl.stepz"):
        load_config(_cfg(tmp_path, "name: p\nsmoke: {rl.stepz: 2}\n"), smoke=True)


@pytest.mark.parametrize("name", ["demo.yaml", "demo-tools.yaml", "demo-guess.yaml", "examples/smollm2-reasoning.yaml",
                                  "examples/smollm2-gsm8k.yaml"])
def test_every_demo_has_a_smoke_size(name):
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "configs" / name
    full, small = load_config(path), load_config(path, smoke=True)
    assert small.rl.steps < full.rl.steps and small.eval.limit < full.eval.limit
