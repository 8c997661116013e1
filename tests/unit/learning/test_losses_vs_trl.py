"""Every policy loss and off-policy correction TRL 1.16 ships, against `GRPOTrainer._compute_loss`
on the same float64 tensors, to 1e-6 in the loss and every gradient.

The log-probs come from a small model and three perturbed copies of it (the behaviour policy,
the sampling engine, the reference), so ratios sit far from 1; each comparison asserts that it
clipped or masked something and had non-zero advantages, so none can pass vacuously.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from hindsight.learning.algorithms.advantages import grpo_advantages
from hindsight.learning.correction import Correction
from hindsight.learning.losses import get_loss
from hindsight.learning.losses.objective import Objective, policy_loss
from tests.unit.learning.trl_reference import config, trl_loss

B, T, GROUP, VOCAB = 12, 8, 3, 13
LOSS_TYPES = ["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"]
# the correction's bounds: TRL's cap of 3 per token; per sequence (a product of T ratios of a
# sampler the anchor disagrees with), bounds around this batch's ratios so both sides fire
BOUNDS = {"token": (0.5, 3.0), "sequence": (0.02, 0.15)}
IS_MODES = [None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
# what TRL refuses (GRPOTrainer.__init__ raises): VESPO takes the engine weights inside, per token
REFUSED = {("vespo", "sequence_truncate"), ("vespo", "sequence_mask")}


def _model(seed: int, scale: float = 1.0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Tanh(), torch.nn.Linear(16, VOCAB)).double()


def _perturbed(model, seed: int, scale: float):
    g = torch.Generator().manual_seed(seed)
    out = _model(0)
    out.load_state_dict({k: v + scale * torch.randn(v.shape, generator=g, dtype=v.dtype)
                         for k, v in model.state_dict().items()})
    return out


def _logp(model, tokens):
    with torch.no_grad():
        logits = model(tokens[:, :-1])                                           # (B, T, V)
        return torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)  # (B, T)


def _sample(model, g):
    """B sequences of T + 1 tokens drawn from the (bigram) model."""
    tokens = [torch.randint(0, VOCAB, (B,), generator=g)]
    with torch.no_grad():
        for _ in range(T):
            probs = torch.softmax(model(tokens[-1]), -1)                         # (B, V)
            tokens.append(torch.multinomial(probs, 1, generator=g).squeeze(-1))
    return torch.stack(tokens, 1)                                                # (B, T + 1)


@pytest.fixture(scope="module")
def batch():
    """Tokens sampled by an engine; the learner's recompute (the anchor) is a perturbed copy of it,
    the trained policy a perturbed copy of that, the reference another."""
    engine = _model(0)
    old = _perturbed(engine, 2, 0.35)
    g = torch.Generator().manual_seed(1)
    tokens = _sample(engine, g)
    mask = (torch.rand(B, T, generator=g) > 0.2).double()
    mask[:, :3] = 1
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 1.0, 2.0, 0.0, 1.0], dtype=torch.float64)
    return {"logp": _logp(_perturbed(old, 3, 0.3), tokens), "old": _logp(old, tokens),
            "engine": _logp(engine, tokens), "ref": _logp(_perturbed(old, 4, 0.2), tokens),
            "mask": mask, "adv": grpo_advantages(rewards, GROUP)}


def _ours(loss_type, level, mode, clip_min, opsm, beta, bias, delta):
    """Our objective for the TRL settings: the loss by TRL's name, its block, the correction."""
    cls = get_loss(loss_type)
    block = {"ratio_level": level}
    if loss_type == "cispo":
        block["clip_max"] = 1.02
    elif loss_type in ("grpo", "dr_grpo", "dapo", "bnpo", "luspo"):
        block.update(clip_eps_low=0.2, clip_eps_high=0.28, delta=delta)
    level_of = {None: "none", "token_truncate": "token", "token_mask": "token",
                "sequence_truncate": "sequence", "sequence_mask": "sequence"}
    correction = Correction(level=level_of[mode], action="truncate" if mode and "truncate" in mode else "mask",
                            clip_min=clip_min, clip_max=_cap(mode), off_policy_mask=opsm)
    return Objective(loss=loss_type, params=cls.Settings(**block), correction=correction, kl_coef=beta,
                     kl_estimator="k3", kl_bias_correction=bias, max_len=T)


def _theirs(loss_type, level, mode, clip_min, opsm, beta, bias, delta):
    eps_high = 1.02 if loss_type == "cispo" else 0.28
    return config(loss_type=loss_type, importance_sampling_level=level, epsilon=0.2, epsilon_high=eps_high,
                  delta=delta, beta=beta, use_bias_correction_kl=bias, off_policy_mask_threshold=opsm,
                  vllm_importance_sampling_correction=mode is not None,
                  vllm_importance_sampling_mode=mode or "sequence_mask", vllm_importance_sampling_clip_min=clip_min,
                  vllm_importance_sampling_clip_max=_cap(mode))


def _cap(mode):
    return BOUNDS["sequence" if mode and mode.startswith("sequence") else "token"][1]


def _compare(b, combo) -> dict:
    loss_type, level, mode, clip_min, opsm, (beta, bias), delta = combo
    engine = b["engine"] if mode is not None else None
    lp_ours = b["logp"].clone().requires_grad_(True)
    ours, stats = policy_loss(lp_ours, b["old"], b["ref"], b["adv"], b["mask"],
                              _ours(loss_type, level, mode, clip_min, opsm, beta, bias, delta), engine_logp=engine)
    ours.backward()
    lp_trl = b["logp"].clone().requires_grad_(True)
    theirs, _ = trl_loss(_theirs(loss_type, level, mode, clip_min, opsm, beta, bias, delta), lp_trl, b["old"], b["ref"],
                         b["adv"].unsqueeze(1), b["mask"], engine=engine)
    theirs.backward()
    assert abs(ours.item() - theirs.item()) < 1e-6, (combo, ours.item(), theirs.item())
    assert torch.allclose(lp_ours.grad, lp_trl.grad, atol=1e-6, rtol=0), combo
    assert lp_ours.grad.abs().sum() > 0, combo
    return stats


def _combos(loss_type, level):
    for mode, clip_min, opsm, kl, delta in itertools.product(
            IS_MODES, [None, "min"], [None, 0.3], [(0.0, False), (0.04, True), (0.04, False)], [None, 1.25]):
        if (mode is None and clip_min is not None) or (loss_type, mode) in REFUSED:
            continue
        if clip_min is not None:
            clip_min = BOUNDS["sequence" if mode.startswith("sequence") else "token"][0]
        if delta is not None and loss_type not in ("grpo", "dr_grpo", "dapo", "bnpo", "luspo"):
            continue  # TRL reads delta in its clipped losses only
        yield loss_type, level, mode, clip_min, opsm, kl, delta


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_and_gradients_equal_trl(batch, loss_type, level):
    n = 0
    for combo in _combos(loss_type, level):
        stats = _compare(batch, combo)
        _, _, mode, _, opsm, _, _ = combo
        if mode is not None:  # the correction moved some weights, and left some alone
            assert 0 < stats["offpolicy/weight_changed_fraction"] < 1, combo
        if opsm is not None:
            assert 0 < stats["offpolicy/sequence_masked_fraction"] < 1, combo
        if "clip_fraction" in stats and loss_type not in ("sapo", "vespo"):
            assert stats["clip_fraction"] > 0, combo
        n += 1
    assert batch["adv"].abs().sum() > 0
    assert n >= 24
    print(f"{loss_type}/{level}: {n} combinations equal TRL's")


def test_the_inputs_are_far_off_policy(batch):
    m = batch["mask"].bool()
    assert (batch["logp"] - batch["old"])[m].abs().max() > 0.5
    assert (batch["old"] - batch["engine"])[m].abs().max() > 1.1  # exp > 3: a token-level cap fires


def test_trl_refuses_what_we_list():
    """The combinations left out above are TRL's own refusals, not ours to skip."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    src = __import__("inspect").getsource(GRPOTrainer.__init__)
    assert "VESPO loss requires `vllm_importance_sampling_mode` to be either 'token_truncate' or" in src


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "sapo", "cispo"])
@pytest.mark.parametrize("quantile", [1.0, 0.4])
def test_entropy_bonus_and_top_entropy_quantile_equal_trl(batch, loss_type, quantile):
    g = torch.Generator().manual_seed(9)
    entropy = (torch.rand(B, T, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    cls = get_loss(loss_type)
    block = {"clip_max": 1.25} if loss_type == "cispo" else {}
    s = Objective(loss=loss_type, params=cls.Settings(**block), entropy_coef=0.05, top_entropy_quantile=quantile,
                  max_len=T, kl_coef=0.04, kl_bias_correction=True)
    lp_ours = batch["logp"].clone().requires_grad_(True)
    ours, _ = policy_loss(lp_ours, batch["old"], batch["ref"], batch["adv"], batch["mask"], s, entropy=entropy)
    ours.backward()
    ent_grad, entropy.grad = entropy.grad.clone(), None
    lp_trl = batch["logp"].clone().requires_grad_(True)
    args = config(loss_type=loss_type, epsilon_high=1.25 if loss_type == "cispo" else None, beta=0.04,
                  entropy_coef=0.05, top_entropy_quantile=quantile)
    theirs, _ = trl_loss(args, lp_trl, batch["old"], batch["ref"], batch["adv"].unsqueeze(1), batch["mask"],
                         entropy=entropy)
    theirs.backward()
    assert abs(ours.item() - theirs.item()) < 1e-6
    assert torch.allclose(lp_ours.grad, lp_trl.grad, atol=1e-6, rtol=0)
    assert torch.allclose(ent_grad, entropy.grad, atol=1e-9, rtol=0) and ent_grad.abs().sum() > 0


@pytest.mark.parametrize("loss_type", ["grpo", "sapo", "cispo", "luspo", "vespo"])
def test_multi_turn_sequence_ratios_cover_model_tokens_only_as_trls_tool_mask(batch, loss_type):
    """A tool's reply inside each trajectory (TRL's tool_mask 0, our action mask 0): the sequence
    ratio, the correction's weights and the reduction run over model tokens only, equal to TRL's,
    and no gradient reaches a tool token."""
    tool = torch.ones(B, T, dtype=torch.float64)
    tool[:, 3:5] = 0
    level = "token" if loss_type == "vespo" else "sequence"
    mode = "token_mask" if loss_type == "vespo" else "sequence_mask"
    combo = (loss_type, level, mode, None, 0.3, 0.04, True, None)
    lp_ours = batch["logp"].clone().requires_grad_(True)
    ours, stats = policy_loss(lp_ours, batch["old"], batch["ref"], batch["adv"], batch["mask"] * tool,
                              _ours(*combo), engine_logp=batch["engine"])
    ours.backward()
    lp_trl = batch["logp"].clone().requires_grad_(True)
    theirs, _ = trl_loss(_theirs(*combo), lp_trl, batch["old"], batch["ref"], batch["adv"].unsqueeze(1),
                         batch["mask"], engine=batch["engine"], tool_mask=tool)
    theirs.backward()
    assert abs(ours.item() - theirs.item()) < 1e-6
    assert torch.allclose(lp_ours.grad, lp_trl.grad, atol=1e-6, rtol=0)
    assert lp_ours.grad[:, 3:5].abs().max() == 0 and lp_ours.grad.abs().sum() > 0
    assert 0 < stats["offpolicy/weight_changed_fraction"] < 1
