"""One rank of the publication memory test (tests/roles/test_publish_memory.py): a sharded
Qwen2 over 2 gloo processes; rank 0 also holds the full rollout copy. Prints, as JSON, the peak
memory each way of publishing adds above what the rank held before it.

Usage: python publish_memory_worker.py RANK PORT BUCKET_BYTES"""
import json
import sys

import torch
import torch.distributed as dist

from hindsight.learning.strategies import sharded as sharding


def rss_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_extra_mib(fn) -> float:
    """Peak resident memory during fn() above the resident memory before it (Linux's VmHWM,
    reset first through clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss_kib("VmRSS")
    fn()
    return (rss_kib("VmHWM") - before) / 1024


def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=1024, hidden_size=256, intermediate_size=1024,
                                        num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                                        tie_word_embeddings=True))


def main(rank: int, port: int, bucket: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    receiver = model().eval() if rank == 0 else None
    sharded = sharding.shard(model())
    full_mib = sum(t.numel() * t.element_size() for _, t in sharding.tensors(sharded)) / 2**20
    largest_mib = max(t.numel() * t.element_size() for _, t in sharding.tensors(sharded)) / 2**20
    for p in sharded.parameters():  # new weights, so the copy has something to take
        p.data.add_(1.0)
    dist.barrier()
    bucketed = peak_extra_mib(lambda: sharding.publish(sharded, receiver, bucket))
    dist.barrier()
    full = {k: v.full_tensor() for k, v in sharded.state_dict().items()}  # a collective: every rank
    same = receiver is None or all(torch.equal(receiver.state_dict()[k], v) for k, v in full.items())
    del full
    dist.barrier()

    def whole():  # what publishing without buckets does: the whole state gathered at once
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(sharded, options=StateDictOptions(full_state_dict=True))
        if receiver is not None:
            receiver.load_state_dict(state)
        del state

    at_once = peak_extra_mib(whole)
    print(json.dumps({"rank": rank, "bucketed_mib": bucketed, "whole_mib": at_once, "full_mib": full_mib,
                      "largest_mib": largest_mib, "bucket_mib": bucket / 2**20, "copied": same}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
