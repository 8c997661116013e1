"""The save probe (models.savable) remembers a folder whose config and generation config passed,
by their bytes: a cached rerun skips loading them, and an edited file is probed anew."""
import json

import pytest

from hindsight.errors import ConfigError
from hindsight.models.savable import check_model_folder, save_probes
from hindsight.models.tiny import build_tiny_model


def test_a_passed_probe_is_remembered_and_an_edited_file_is_probed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = build_tiny_model(tmp_path / "m", hidden=16, layers=1, heads=2)
    check_model_folder(folder, "model.base")
    assert len(list(save_probes().iterdir())) == 1
    check_model_folder(folder, "model.base")  # the same bytes: nothing new to remember
    assert len(list(save_probes().iterdir())) == 1
    gen = folder / "generation_config.json"
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "num_return_sequences": 3}))
    with pytest.raises(ConfigError, match="generation_config.json: the model cannot be saved"):
        check_model_folder(folder, "model.base")
    assert len(list(save_probes().iterdir())) == 1  # a refused folder leaves no marker
