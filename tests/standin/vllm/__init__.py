"""A stand-in for vLLM 0.33's offline `LLM` in its default process layout, for tests on a CPU.

What it keeps of vLLM (checked against vllm 0.33.0's source: entrypoints/llm.py, v1/engine/
llm_engine.py, v1/serial_utils.py, v1/worker/worker_base.py):
- the engine core, with the worker and its model, runs in a process of its own
  (VLLM_ENABLE_V1_MULTIPROCESSING=1, the default), so `llm.llm_engine` has no `model_executor`;
- `collective_rpc(method, args=...)` carries its method and arguments across with vLLM's rules:
  a method named by a string, and arguments of plain types and tensors; anything else (a
  callable included) raises vLLM's TypeError unless VLLM_ALLOW_INSECURE_SERIALIZATION=1;
- `worker_extension_cls` (a qualified name) is mixed into the worker class, and a string method
  is looked up on the worker;
- the worker's `model_runner.model.load_weights` takes (Hugging Face name, tensor) pairs, and
  `model_runner.model.parameters()` gives its weights (in vLLM it is an nn.Module).
Sampling is transformers' greedy or seeded sampling, not vLLM's kernels.
"""
from __future__ import annotations

import importlib
import multiprocessing as mp
import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

_PLAIN = (str, int, float, bool, type(None), bytes)


def _check_serializable(obj, where: str = "args") -> None:
    """vLLM's MsgpackEncoder: plain types, containers of them and tensors; else a TypeError."""
    if isinstance(obj, _PLAIN) or isinstance(obj, torch.Tensor):
        return
    if isinstance(obj, (list, tuple)):
        for x in obj:
            _check_serializable(x, where)
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            _check_serializable(k, where), _check_serializable(v, where)
        return
    if os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") == "1":
        return
    raise TypeError(f"Object of type {type(obj)} is not serializableSet VLLM_ALLOW_INSECURE_SERIALIZATION=1 to "
                    f"allow fallback to pickle-based serialization.")


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 16
    logprobs: int | None = None
    seed: int | None = None
    stop_token_ids: list = field(default_factory=list)


class _Runner:
    def __init__(self, model):
        self.model = model


class _HFModel:
    """The engine's model: vLLM's models load weights by their Hugging Face names."""

    def __init__(self, path: str, dtype: str):
        from transformers import AutoModelForCausalLM

        self.hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()

    def parameters(self):  # vLLM's model is an nn.Module
        return self.hf.parameters()

    def load_weights(self, weights) -> set:
        own = self.hf.state_dict()
        with torch.no_grad():
            for name, w in weights:
                own[name].copy_(w)
        return {name for name, _ in weights}


class _WorkerBase:
    def __init__(self, path: str, dtype: str):
        self.device = torch.device("cpu")
        self.model_runner = _Runner(_HFModel(path, dtype))


def _engine_core(conn, path: str, dtype: str, extension: str | None) -> None:
    """The engine core's process: builds the worker (with the extension mixed in) and serves."""
    bases = (_WorkerBase,)
    if extension:
        module, _, name = extension.rpartition(".")
        bases = (_WorkerBase, getattr(importlib.import_module(module), name))
    worker = type("Worker", bases, {})(path, dtype)
    conn.send(("ready", os.getpid()))
    while True:
        op, payload = conn.recv()
        try:
            if op == "shutdown":
                return
            if op == "collective_rpc":
                method, args, kwargs = payload
                conn.send(("ok", [getattr(worker, method)(*args, **kwargs)]))
            elif op == "generate":
                conn.send(("ok", _generate(worker.model_runner.model.hf, *payload)))
            elif op == "reset_prefix_cache":
                conn.send(("ok", True))
        except Exception as exc:  # the engine reports, the client raises
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _generate(model, prompts: list[list[int]], p: SamplingParams) -> list:
    out = []
    for ids in prompts:
        samples = []
        for i in range(p.n):
            if p.seed is not None:
                torch.manual_seed(p.seed + i)
            x = torch.tensor([ids])
            gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=p.max_tokens,
                                 do_sample=p.temperature > 0, temperature=p.temperature or None,
                                 top_p=p.top_p, eos_token_id=list(p.stop_token_ids) or None,
                                 pad_token_id=0, output_scores=True, return_dict_in_generate=True)
            tokens = gen.sequences[0, len(ids):].tolist()
            logprobs = [{t: SimpleNamespace(logprob=float(torch.log_softmax(s[0], -1)[t]))}
                        for t, s in zip(tokens, gen.scores)]
            samples.append(SimpleNamespace(token_ids=tokens, logprobs=logprobs))
        out.append(SimpleNamespace(outputs=samples))
    return out


class _MPClient:
    """The engine-core client of the multiprocess layout: all the LLM process has of the engine."""

    def __init__(self, path: str, dtype: str, extension: str | None):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_engine_core, args=(child, path, dtype, extension), daemon=True)
        self.proc.start()
        _, self.pid = self.conn.recv()

    def call(self, op: str, payload=None):
        self.conn.send((op, payload))
        status, value = self.conn.recv()
        if status == "error":
            raise RuntimeError(f"engine core: {value}")
        return value


class _LLMEngine:
    def __init__(self, client: _MPClient):
        self.engine_core = client  # no model_executor: the executor lives in the engine-core process

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        _check_serializable(method, "method") if not isinstance(method, str) else None
        _check_serializable(args), _check_serializable(kwargs or {})
        return self.engine_core.call("collective_rpc", (method, args, kwargs or {}))


class LLM:
    def __init__(self, model: str, dtype: str = "float32", seed: int = 0, worker_extension_cls: str = "", **_):
        self.llm_engine = _LLMEngine(_MPClient(model, dtype, worker_extension_cls or None))
        self.rpc_calls = 0

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.rpc_calls += 1
        return self.llm_engine.collective_rpc(method, timeout, args, kwargs)

    def generate(self, prompts, sampling_params: SamplingParams, use_tqdm: bool = True):
        return self.llm_engine.engine_core.call("generate", ([p["prompt_token_ids"] for p in prompts], sampling_params))

    def reset_prefix_cache(self, *_, **__) -> bool:
        return self.llm_engine.engine_core.call("reset_prefix_cache")

    def engine_pid(self) -> int:
        return self.llm_engine.engine_core.pid
