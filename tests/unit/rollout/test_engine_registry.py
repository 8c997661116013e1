"""A rollout engine is one class in a registry: registering a test-only one in one file
(`echo_engine.py`) makes the config take its name and its block, the stage's preflight ask it,
the resume fingerprint leave out what it says changes nothing sampled, and the rollout worker
sample with it."""
import pytest

from hindsight.config import PipelineConfig
from hindsight.errors import ConfigError
from hindsight.rollout.engines import ENGINES, unregister
from hindsight.state.fingerprint import run_fingerprint
from helpers import rl_cfg, tiny_init


@pytest.fixture
def echo():
    import echo_engine

    ENGINES["echo"] = echo_engine.Echo  # registered again if another test unregistered it
    echo_engine.Echo.refuse, echo_engine.Echo.loads = None, 0
    yield echo_engine.Echo
    unregister("echo")


def test_the_config_takes_the_engine_and_its_block(echo, tmp_path):
    cfg = PipelineConfig.model_validate({"rl": {"rollout": {"backend": "echo", "echo": {"token": 7}}}})
    assert cfg.rl.rollout.engine_settings().token == 7 and cfg.rl.rollout.engine_settings("echo").length == 3
    with pytest.raises(ValueError, match=r"rollout.echo.tokn\n  Extra inputs are not permitted"):
        PipelineConfig.model_validate({"rl": {"rollout": {"backend": "echo", "echo": {"tokn": 7}}}})
    with pytest.raises(ValueError, match=r"unknown rollout engine 'nope'; registered: echo, hf, vllm"):
        PipelineConfig.model_validate({"rl": {"rollout": {"backend": "nope"}}})
    with pytest.raises(ValueError, match=r"rollout.other\n  Extra inputs are not permitted"):
        PipelineConfig.model_validate({"rl": {"rollout": {"other": {}}}})


def test_the_stage_preflight_asks_the_engine(echo, tmp_path):
    from flows.rl import RL
    from hindsight.stage import preflight

    tiny_init(tmp_path)
    cfg = rl_cfg(tmp_path, rollout={"backend": "echo", "max_new_tokens": 4})
    echo.refuse = "no echo device here"
    with pytest.raises(ConfigError, match="rl.rollout.backend: echo cannot run: no echo device here"):
        preflight(RL, cfg)


def test_the_fingerprint_keeps_what_the_engine_samples_by(echo, tmp_path):
    def sampling(**block):
        cfg = PipelineConfig.model_validate({"run_dir": str(tmp_path / "r"), "data": {"prompts": __file__},
                                             "rl": {"rollout": {"backend": "echo", "echo": block}}})
        return run_fingerprint(cfg, "init", None, lambda spec: "src", ENGINES)["sampling"]["rollout"]

    assert sampling() == sampling(label="other")  # changes nothing sampled
    assert sampling() != sampling(token=9)
    assert sampling()["echo"] == {"token": 5, "length": 3}


def test_the_worker_samples_with_it(echo, tmp_path):
    from hindsight.coordination.run import RLRun

    init = tiny_init(tmp_path)
    run = RLRun(rl_cfg(tmp_path, rollout={"backend": "echo", "max_new_tokens": 4, "echo": {"token": 7}}), init, None)
    try:
        run.rollout(0), run.score(0), run.update(0)
        rows = run.store.read("rollouts", 0)
        eos = run.tok.eos_token_id
        assert {tuple(r["completion_ids"]) for r in rows} == {(7, 7, 7, eos)}
        assert all(r["ended_with_eos"] for r in rows)
        # the engine's log-probs are not the learner's: recomputed by the training model, its own kept
        assert all(lp < 0 for r in rows for lp in r["logprobs"]) and rows[0]["engine_logprobs"] == [0.0] * 4
        assert echo.loads == 1
    finally:
        run.close()
