"""GPU check: a ~100M-parameter model built in code, a few RL steps with hf and with vllm rollouts,
then vllm rollouts synchronous (`rl.async.max_staleness: 0`) against asynchronous (k = 1: the
sampler process generates step s + 1 while the learner trains step s), then the FSDP2 learner
(`learner_strategy: fsdp2` over the visible GPUs, bf16 compute on fp32 masters, NCCL) with its
publication time and peak GPU memory, and the vLLM push: greedy answers before and after
pushing changed weights into the engine (they must change).

Installs and downloads nothing. Prints rollout tokens/s per backend and the update's
throughput (trained tokens per second), side by side, then the step time and the sampled
tokens per second of a whole step for k = 0 and k = 1. Run through bench/gpu_check.sh.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from hindsight.config import PipelineConfig
from hindsight.data.demo import build_demo_data
from hindsight.models.tiny import build_tiny_model
from hindsight.coordination.run import RLRun


def run(backend: str, work: Path, init: str, steps: int, staleness: int = 0, workers: dict | None = None) -> dict:
    cfg = PipelineConfig.model_validate({
        "name": f"gpu-{backend}-k{staleness}", "run_dir": str(work / f"{backend}-k{staleness}"),
        "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
        "model": {"dtype": "bfloat16"},
        "rl": {"steps": steps, "prompts_per_step": 64, "samples_per_prompt": 8, "reward_isolation": "inline",
               "save_every": steps, "alerts": [], "async": {"max_staleness": staleness}, "workers": workers or {},
               "rollout": {"backend": backend, "max_new_tokens": 128, "temperature": 1.0,
                           "vllm": {"gpu_memory_utilization": 0.35, "max_model_len": 512}}}})
    torch.cuda.reset_peak_memory_stats()
    rl = RLRun(cfg, init, None)
    assert rl.policy.device.type == "cuda"  # models load onto the GPU when there is one
    rows = []
    for step in range(steps):
        t_step = time.perf_counter()
        _, gen = rl.rollout(step)
        rl.score(step)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        upd = rl.update(step)
        torch.cuda.synchronize()
        done = time.perf_counter()
        trained = sum(len(r["completion_ids"]) for r in rl.store.read("rollouts", step))
        rows.append({"tokens_per_s": gen.get("rollout/tokens_per_s", float("nan")),  # async: sampled elsewhere
                     "update_tokens_per_s": trained / (done - t0), "step_s": done - t_step,
                     "publish_s": upd.get("time/publish_s", float("nan")),
                     "peak_gpu_gb": torch.cuda.max_memory_allocated() / 2**30,
                     "step_tokens_per_s": trained / (done - t_step), "reward": upd["reward/mean"]})
    rl.close()
    warm = rows[1:] or rows  # the first step pays for compilation and the engine's start
    return {k: sum(r[k] for r in warm) / len(warm) for k in rows[0]}


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU visible: this check needs one")
        return 2
    steps = int(os.environ.get("GPU_CHECK_STEPS", "4"))
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    build_demo_data(work / "data", seed=0)
    init = str(build_tiny_model(work / "init", hidden=768, layers=12, heads=12))
    n_params = sum(p.numel() for p in __import__("hindsight.models.load", fromlist=["x"]).load_causal_lm(init).parameters())
    print(f"model: {n_params / 1e6:.0f}M parameters, {torch.cuda.get_device_name()}")
    results = {}
    for backend in ("hf", "vllm"):
        try:
            results[backend] = run(backend, work, init, steps)
        except Exception as exc:  # report, and still print the other backend's figures
            results[backend] = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"{'backend':8} {'rollout tok/s':>14} {'update tok/s':>13} {'reward':>7}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:8} {r['error']}")
        else:
            print(f"{name:8} {r['tokens_per_s']:14.0f} {r['update_tokens_per_s']:13.0f} {r['reward']:7.3f}")
    if all("error" not in r for r in results.values()):
        print(f"vllm / hf rollout throughput: {results['vllm']['tokens_per_s'] / results['hf']['tokens_per_s']:.2f}x")
    results.update(_async(work, init, steps))
    results.update(_fsdp2(work, init, steps))
    results.update(_vllm_push(work, init))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(json.dumps(results, indent=1))
    return 0 if all("error" not in r for r in results.values()) else 1


def _async(work: Path, init: str, steps: int) -> dict:
    """vllm rollouts, k = 0 against k = 1: seconds per step and sampled tokens per second of a step."""
    out = {}
    for k in (0, 1):
        try:
            out[f"vllm k={k}"] = run("vllm", work, init, max(steps, 4), staleness=k)
        except Exception as exc:
            out[f"vllm k={k}"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"{'async':8} {'s/step':>8} {'step tok/s':>11} {'reward':>7}")
    for name, r in out.items():
        print(f"{name:8} {r['error']}" if "error" in r else
              f"{name:8} {r['step_s']:8.3f} {r['step_tokens_per_s']:11.0f} {r['reward']:7.3f}")
    if all("error" not in r for r in out.values()):
        ratio = out["vllm k=1"]["step_tokens_per_s"] / out["vllm k=0"]["step_tokens_per_s"]
        print(f"ratio async/sync step tokens/s (vllm): {ratio:.2f}")
    return out


def _fsdp2(work: Path, init: str, steps: int) -> dict:
    """The sharded learner over the visible GPUs (a group of one on one GPU), hf rollouts."""
    n = torch.cuda.device_count()
    workers = {"learner_strategy": "fsdp2", "learner": n, "placement": "ray" if n > 1 else "local",
               "resources": {"learner": {"num_cpus": 1, "num_gpus": 1}}}
    try:
        r = run("hf", work, init, steps, workers=workers)
    except Exception as exc:
        r = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"fsdp2 P={n}: " + (r["error"] if "error" in r else
          f"update tok/s {r['update_tokens_per_s']:.0f}, publish {r['publish_s']:.3f} s, peak GPU {r['peak_gpu_gb']:.1f} GB"))
    return {f"fsdp2 P={n}": r}


def _vllm_push(work: Path, init: str) -> dict:
    """Greedy answers of the resident engine before and after a push of changed weights."""
    from hindsight.models.load import load_causal_lm, load_tokenizer
    from hindsight.rollout.vllm import VLLMEngine

    try:
        engine = VLLMEngine(init, "bfloat16", 0, 0.3, 512)
        tok, policy = load_tokenizer(init), load_causal_lm(init, "bfloat16")
        prompts = ["Compute 3 + 4.", "Compute 12 + 30."]
        answer = lambda: engine.generate(tok, prompts, 1, 16, 0.0, 1.0, 0).completion_ids.tolist()  # noqa: E731
        before = answer()
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.load_weights(policy)
        push_s = time.perf_counter() - t0
        after = answer()
        r = {"push_s": push_s, "changed": before != after}
    except Exception as exc:
        r = {"error": f"{type(exc).__name__}: {exc}"}
    print("vllm push: " + (r["error"] if "error" in r else f"{r['push_s']:.3f} s, outputs changed: {r['changed']}"))
    return {"vllm push": r}


if __name__ == "__main__":
    sys.exit(main())
