"""The sharded learner's own logic that needs no process group: how the full weights are cut
into buckets, tied weights named once, a bucket copied into the rollout copy, the zero-weighted
micro-batches that keep ranks in step, and the config's refusals."""
import pytest
import torch

from hindsight.config import LearnerConfig, PipelineConfig
from hindsight.learning.strategies import sharded as sharding
from hindsight.learning.strategies.replicated import Replicated
from hindsight.learning.strategies.sharded import Sharded
from hindsight.learning.update import Share, _with_idle
from hindsight.transport.vllm import weight_buckets


def tied_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))


def test_buckets_hold_every_tensor_once_within_the_size():
    model = tied_model()
    names = [n for n, _ in sharding.tensors(model)]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names  # the tied head once
    assert sharding.aliases(model) == {"lm_head.weight": "model.embed_tokens.weight"}
    sizes = {n: t.numel() * t.element_size() for n, t in sharding.tensors(model)}
    bucket = 4096  # bytes: the 64 x 16 embedding (4,096 bytes) fills one alone
    buckets = list(sharding.full_buckets(model, bucket))
    assert [n for b in buckets for n in b] == names  # in order, each once
    for b in buckets:
        total = sum(sizes[n] for n in b)
        assert total <= bucket or len(b) == 1  # a bucket stays within its size, or is one larger tensor
    assert len(buckets) > 2


def test_a_bucket_is_copied_into_the_rollout_copy_in_place():
    source, receiver = tied_model(), tied_model()
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)
    before = receiver.model.embed_tokens.weight.data_ptr()
    for b in sharding.full_buckets(source, 2048):
        sharding.copy_into(receiver, b)
    for k, v in source.state_dict().items():
        assert torch.equal(receiver.state_dict()[k], v), k
    assert receiver.model.embed_tokens.weight.data_ptr() == before  # no second copy was made
    assert torch.equal(receiver.lm_head.weight, source.lm_head.weight)  # the tied head follows
    with pytest.raises(KeyError, match="no tensor model.extra.weight: the learner and the rollout model"):
        sharding.copy_into(receiver, {"model.extra.weight": torch.zeros(1)})


def test_idle_micro_batches_count_for_nothing():
    assert _with_idle([[0, 1], [2]], 2, 0.5, 1.0) == [([0, 1], 0.5, 1.0), ([2], 0.5, 1.0), ([0], 0.0, 0.0),
                                                     ([0], 0.0, 0.0)]
    assert Sharded(0, 4, LearnerConfig()).grad_scale == 4.0  # FSDP2 averages: the sum comes back
    assert Replicated(0, 4, LearnerConfig()).grad_scale == 1.0 and Share().most(3) == 3


def test_vllm_weight_buckets():
    weights = [("a", torch.zeros(256)), ("b", torch.zeros(256)), ("c", torch.zeros(1024)), ("d", torch.zeros(8))]
    buckets = weight_buckets(weights, 2048)  # 1 KiB, 1 KiB, 4 KiB, 32 B
    assert [[n for n, _ in b] for b in buckets] == [["a", "b"], ["c"], ["d"]]
    assert all(t.device.type == "cpu" for b in buckets for _, t in b)


def _rl(tmp_path, **learner):
    return {"run_dir": str(tmp_path / "r"), "rl": {"learner": learner}}


def test_the_config_refuses_what_is_not_built(tmp_path):
    with pytest.raises(ValueError, match="offload moves a sharded learner's state to the CPU; strategy ddp"):
        PipelineConfig.model_validate(_rl(tmp_path, offload=True))
    with pytest.raises(ValueError, match="learner.strategy: fsdp2 does not shard one yet"):
        PipelineConfig.model_validate({"run_dir": str(tmp_path / "r"),
                                       "rl": {"learner": {"strategy": "fsdp2"}, "lora": {"enabled": True}}})
    with pytest.raises(ValueError, match="combine with learner.processes > 1 .its other ranks run as Ray actors"):
        PipelineConfig.model_validate(_rl(tmp_path, processes=2, strategy="fsdp2"))
    with pytest.raises(ValueError, match="unknown learner strategy 'zero3'; registered: ddp, fsdp2"):
        PipelineConfig.model_validate(_rl(tmp_path, strategy="zero3"))
    cfg = PipelineConfig.model_validate(_rl(tmp_path, strategy="fsdp2", offload=True))
    assert cfg.rl.learner.processes == 1  # a sharded group of one: offload on one device


def test_a_learner_that_fails_to_start_leaves_no_process_group(tmp_path, monkeypatch):
    """A sharded learner that fails after its group started (here: sharding itself) closes the
    group, so the stage's retry in the same process can start a new one."""
    import torch.distributed as dist

    from hindsight.coordination.learner_group import start_learner_group
    from hindsight.learning.learner import Learner
    from hindsight.models.tiny import build_tiny_qwen2
    from hindsight.state.checkpoint import CheckpointManager

    init = str(build_tiny_qwen2(tmp_path / "init", hidden=16, layers=1, heads=2, kv_heads=1))
    cfg = PipelineConfig.model_validate(_rl(tmp_path, strategy="fsdp2"))

    def broken(*_a, **_k):
        assert dist.is_initialized()  # the group of one is up when sharding starts
        raise RuntimeError("no memory for the shards")

    monkeypatch.setattr(Sharded, "_shard", broken)
    with pytest.raises(RuntimeError, match="no memory for the shards"):
        Learner(cfg, init, None, CheckpointManager(tmp_path / "ck"), None, 0,
                start_group=start_learner_group(cfg, 0, init, False))
    assert not dist.is_initialized()
