"""LoRA in RL: only the adapter trains; the reference is the base under the adapter (no second
copy) and equals the base model; checkpoints hold the adapter, resume from it, and the
adapter folder loads (merged) like any model."""
import torch

from hindsight.models.lora import AdapterDisabled, engine_parameters, is_adapter_dir, trainable_parameters
from hindsight.models.load import load_causal_lm
from hindsight.coordination.run import RLRun
from helpers import rl_cfg, tiny_init

LORA = {"enabled": True, "r": 4, "alpha": 8}


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_lora_rl_trains_only_the_adapter_checkpoints_and_resumes(tmp_path):
    init = tiny_init(tmp_path)
    base = load_causal_lm(init)
    ids = torch.tensor([[1, 5, 9, 13, 7]])
    cfg = rl_cfg(tmp_path, steps=4, save_every=2, lr=1e-2, lora=LORA, kl={"coef": 0.05})
    run = RLRun(cfg, init, None)
    assert isinstance(run.pool.scoring.ref, AdapterDisabled)
    assert 0 < trainable_parameters(run.policy) < sum(p.numel() for p in base.parameters()) / 5
    for step in (0, 1):
        run.rollout(step), run.score(step), run.update(step)
    torch.testing.assert_close(_logits(run.pool.scoring.ref, ids), _logits(base, ids))  # the reference is the base
    assert not torch.allclose(_logits(run.policy, ids), _logits(base, ids))  # the adapter learned something
    frozen = {n.replace("base_model.model.", "").replace(".base_layer", ""): p for n, p in run.policy.named_parameters()
              if "lora_" not in n}
    for name, p in base.named_parameters():
        assert torch.equal(frozen[name], p), name  # the base never moves
    ckpt = run.ckpt.policy_dir(2)
    assert is_adapter_dir(ckpt) and not (ckpt / "model.safetensors").exists()
    at_two = _logits(run.policy, ids)
    merged = dict(engine_parameters(run.policy))  # what vLLM would load: plain names, merged weights
    assert set(merged) == {n for n, _ in base.named_parameters()}
    run.close()

    resumed = RLRun(cfg, init, None)
    assert resumed.start_step == 2
    torch.testing.assert_close(_logits(resumed.policy, ids), at_two)
    torch.testing.assert_close(_logits(load_causal_lm(str(ckpt)), ids), at_two)  # the folder loads merged
    for step in (2, 3):
        resumed.rollout(step), resumed.score(step), resumed.update(step)
    assert is_adapter_dir(resumed.ckpt.policy_dir(4))
    resumed.close()
