"""The config's blocks by role: `rl.learner` holds every learner knob and `rl.scoring` the
rewards; the old spellings are accepted for one release with one deprecation line each, in a
file, in `--set` and in a sweep alike; a key given both ways is refused. And no learner knob can
escape the resume fingerprint: every config value the learner's settings read changes it."""
import logging
import typing

import pytest
from pydantic import BaseModel

from hindsight.config import LearnerConfig, PipelineConfig, load_config
from hindsight.config.legacy import MOVED
from hindsight.errors import ConfigError
from hindsight.learning.update import learner_settings
from hindsight.rollout.engines import ENGINES
from hindsight.state.fingerprint import run_fingerprint

# a valid value for each moved key, away from its default
VALUES = {"lr": 0.5, "clip_eps_low": 0.1, "clip_eps_high": 0.3, "clip_ratio_c": 3.0, "loss_agg": "token_mean",
          "num_iterations": 2, "mini_batch_size": 16, "micro_batch_tokens": 64, "max_grad_norm": 0.5,
          "entropy_coef": 0.01, "disable_dropout": False, "learner": 1, "learner_strategy": "fsdp2",
          "learner_offload": True, "publish_bucket_mb": 8.0, "rewards": [{"fn": "rewards.format:number_only"}],
          "reward_model_weight": 0.5, "reward_fallback": -1.0, "reward_failure_stop": 0.5, "reward_timeout_s": 9.0,
          "reward_isolation": "inline"}


def _dig(model, path):
    for part in path:
        model = getattr(model, part)
    return model


@pytest.mark.parametrize("old", list(MOVED), ids=".".join)
def test_an_old_key_lands_in_its_block_and_says_so_once(old, caplog):
    new, value = MOVED[old], VALUES[old[-1]]
    rl = {old[0]: {old[1]: value}} if len(old) == 2 else {old[0]: value}
    if old[-1] == "learner_offload":
        rl["workers"]["learner_strategy"] = "fsdp2"
    with caplog.at_level(logging.WARNING, logger="hindsight"):
        cfg = PipelineConfig.model_validate({"rl": rl})
    got = _dig(cfg.rl, new)
    assert (got == value) if old[-1] != "rewards" else (got[0].fn == value[0]["fn"])
    said = [r.getMessage() for r in caplog.records if ".".join(("rl", *old)) + " is deprecated" in r.getMessage()]
    assert said == [f"rl.{'.'.join(old)} is deprecated: write rl.{'.'.join(new)} (the old key is accepted until "
                    f"hindsight 0.3)"]


def test_a_key_given_both_ways_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rl:\n  lr: 0.1\n  learner:\n    lr: 0.2\n")
    with pytest.raises(ConfigError, match="rl.lr and rl.learner.lr are both set: keep rl.learner.lr"):
        load_config(path)


def test_set_takes_the_old_spelling_onto_a_file_written_with_blocks(tmp_path, caplog):
    path = tmp_path / "c.yaml"
    path.write_text("rl:\n  learner: {lr: 0.1}\n  scoring: {isolation: inline}\n")
    with caplog.at_level(logging.WARNING, logger="hindsight"):
        cfg = load_config(path, ["rl.lr=0.3", "rl.reward_timeout_s=5", "rl.workers.learner_strategy=fsdp2"])
    assert cfg.rl.learner.lr == 0.3 and cfg.rl.scoring.timeout_s == 5 and cfg.rl.learner.strategy == "fsdp2"
    assert cfg.rl.scoring.isolation == "inline"
    assert sum("is deprecated" in r.getMessage() for r in caplog.records) == 3


def test_an_error_on_an_old_key_names_it_as_written(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\nrl:\n  steps: 2\n  reward_timeout_s: -1\n")
    with pytest.raises(ConfigError, match=r"c.yaml:4: rl.reward_timeout_s: Input should be greater than 0"):
        load_config(path)


# --- the fingerprint holds every learner knob ------------------------------------------------
class Reads:
    """A config seen through a recorder: every leaf value read through it is noted by its path."""

    def __init__(self, model, path, seen):
        self._model, self._path, self._seen = model, path, seen

    def __getattr__(self, name):
        value = getattr(self._model, name)
        if callable(value) and not isinstance(value, BaseModel):
            # rl.algorithm_settings(), learner.loss_settings(), rollout.engine_settings(name): each a block
            def block(*a):
                if name == "engine_settings":
                    return a[0] if a else self._model.backend
                return self._model.algorithm if name == "algorithm_settings" else self._model.loss
            return lambda *a, **k: Reads(value(*a, **k), (*self._path, block(*a)), self._seen)
        if isinstance(value, BaseModel):
            return Reads(value, (*self._path, name), self._seen)
        self._seen.add((*self._path, name))
        return value


def _candidates(model_cls, name, current):
    """Other valid values for a field: from a Literal's choices, or near its current value."""
    ann = model_cls.model_fields[name].annotation
    if typing.get_origin(ann) is typing.Literal:
        return [v for v in typing.get_args(ann) if v != current]
    if isinstance(current, bool):
        return [not current]
    if isinstance(current, (int, float)):
        return [v for v in (current * 2, current + 1, current / 2, 1.5) if v != current]
    if current is None:
        return [16, 64, 3.0, 0.5]
    return {"algorithm": ["rloo"], "loss": ["dapo"], "backend": ["vllm"]}.get(name, [])


def _as_dumped(model, path) -> tuple:
    """A field path in the names the config's dump uses (its aliases: rl.async, rl.kl.in)."""
    out = []
    for part in path:
        field = type(model).model_fields.get(part)
        out.append(field.alias if field is not None and field.alias else part)
        model = getattr(model, part)
    return tuple(out)


def _with(raw: dict, path, value) -> dict:
    node = raw
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return raw


def test_every_value_the_learner_reads_is_in_the_resume_fingerprint(tmp_path):
    base = PipelineConfig.model_validate({"run_dir": str(tmp_path / "r"), "data": {"prompts": __file__},
                                          "rl": {"samples_per_prompt": 8}})
    seen: set = set()
    learner_settings(Reads(base.rl, ("rl",), seen))
    assert ("rl", "learner", "max_grad_norm") in seen and ("rl", "rollout", "temperature") in seen and len(seen) > 12

    def fingerprint(cfg):
        return run_fingerprint(cfg, "init", None, lambda spec: "src", ENGINES)

    before = fingerprint(base)
    for path in sorted(seen):
        owner = _dig(base, path[:-1])
        tried = []
        for value in _candidates(type(owner), path[-1], getattr(owner, path[-1])):
            raw = _with(base.model_dump(mode="json", by_alias=True), _as_dumped(base, path), value)
            try:
                changed = PipelineConfig.model_validate(raw)
            except ValueError:
                continue
            tried.append(value)
            assert fingerprint(changed) != before, f"{'.'.join(path)} = {value!r} leaves the fingerprint unchanged"
            break
        assert tried, f"no valid other value found for {'.'.join(path)}"


def _knobs(cls, prefix=()) -> list[tuple[str, ...]]:
    """Every leaf field of a config block, nested blocks included."""
    out = []
    for name, field in cls.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += _knobs(field.annotation, (*prefix, name))
        else:
            out.append((*prefix, name))
    return out


@pytest.mark.parametrize("knob", _knobs(LearnerConfig), ids=".".join)
def test_each_learner_knob_is_in_the_training_section(knob, tmp_path):
    base = PipelineConfig.model_validate({"run_dir": str(tmp_path / "r"), "data": {"prompts": __file__},
                                          "rl": {"samples_per_prompt": 8, "learner": {"strategy": "fsdp2"},
                                                 "workers": {"placement": "ray"}}})
    owner = _dig(base.rl.learner, knob[:-1])
    field, current = knob[-1], getattr(owner, knob[-1])
    for value in _candidates(type(owner), field, current) or ["ddp"]:
        raw = base.model_dump(mode="json", by_alias=True)
        _with(raw["rl"]["learner"], knob, value)
        try:
            changed = PipelineConfig.model_validate(raw)
        except ValueError:
            continue
        a = run_fingerprint(base, "i", None, lambda s: "x", ENGINES)["training"]
        b = run_fingerprint(changed, "i", None, lambda s: "x", ENGINES)["training"]
        assert a != b
        return
    pytest.fail(f"no valid other value for rl.learner.{'.'.join(knob)}")


@pytest.mark.parametrize("where", ["rl", "learner"])
def test_the_old_loss_keys_land_in_the_loss_and_its_block_and_say_so_once(where, caplog):
    """`loss_agg` becomes the loss it named, the clip keys its block's, async's TIS the correction."""
    old = {"loss_agg": "token_mean", "clip_eps_high": 0.28, "clip_ratio_c": 3.0}
    rl = {**old, "async": {"is_correction": "tis", "is_cap": 2.5}} if where == "rl" else {
        "learner": old, "async": {"is_correction": "tis", "is_cap": 2.5}}
    with caplog.at_level(logging.WARNING, logger="hindsight"):
        learner = PipelineConfig.model_validate({"rl": rl}).rl.learner
    assert learner.loss == "dapo" and learner.loss_settings().clip_eps_high == 0.28
    assert learner.loss_settings().clip_ratio_c == 3.0
    assert (learner.correction.level, learner.correction.action, learner.correction.clip_max) == ("token", "truncate", 2.5)
    prefix = "rl." if where == "rl" else "rl.learner."
    said = [r.getMessage() for r in caplog.records if "is deprecated" in r.getMessage()]
    assert said == [f"{prefix}loss_agg is deprecated: write rl.learner.loss: dapo (the old key is accepted until "
                    f"hindsight 0.3)",
                    *(f"{prefix}{k} is deprecated: write rl.learner.dapo.{k} (the old key is accepted until "
                      f"hindsight 0.3)" for k in ("clip_eps_high", "clip_ratio_c")),
                    "rl.async.is_correction is deprecated: write rl.learner.correction (the old key is accepted "
                    "until hindsight 0.3)"]
