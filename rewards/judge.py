"""An LLM as a judge: each completion is scored by a model served over the OpenAI-compatible
chat API (vLLM, SGLang, `transformers serve`), from a rubric that holds the prompt, the
completion and any dataset column.

    rewards:
      - fn: rewards.judge:judge
        args:
          base_url: http://127.0.0.1:8000/v1
          model: Qwen/Qwen2.5-7B-Instruct
          rubric: "Question: {prompt}\nAnswer: {completion}\nReference: {answer}\n
                   Do the steps form a coherent solution? Reply `score: 1` or `score: 0`."
          gate: "rewards.math:math_answer"   # optional: the judge checks a rule reward a second time
          gate_mode: multiply                # rule x judge, or `replace`: the judge's score where the rule passed

The verdict is the last `score: X` in the judge's answer, X in [min_score, max_score], scaled to
[0, 1]. An answer without one, a request that fails after its retries or times out, gets None:
the RL scorer gives it the fallback and counts it (`reward/failures/judge`), and a judge that
fails on every completion stops the run (`rl.scoring.failure_stop`).

Verdicts are cached in `cache_dir` (default the run context's `cache_for("judge")`, under the RL
stage's folder: the scorer hands the context to a reward that names a `run_context` parameter),
keyed by the judge model, the rubric and the filled-in text: a resumed run or a re-score does
not ask twice. The key comes from the environment variable `api_key_env` names,
never from the YAML.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rewards import completion_text

_SCORE = re.compile(r"score\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
GATE_MODES = ("multiply", "replace")


def parse_score(answer: str, min_score: float = 0.0, max_score: float = 1.0) -> float | None:
    """The last `score: X` of the judge's answer scaled to [0, 1]; None when there is none or X is
    outside [min_score, max_score] (a judge's answer is never guessed at)."""
    found = _SCORE.findall(answer or "")
    if not found:
        return None
    value = float(found[-1])
    if not min_score <= value <= max_score:
        return None
    return (value - min_score) / (max_score - min_score)


def render(rubric: str, prompt, completion, columns: dict) -> str:
    """The rubric with `{prompt}`, `{completion}` and the row's columns filled in; a chat prompt
    is shown one `role: content` line per turn."""
    if isinstance(prompt, list):
        prompt = "\n".join(f"{m.get('role')}: {m.get('content', '')}" for m in prompt if isinstance(m, dict))
    return rubric.format(prompt=prompt if prompt is not None else "", completion=completion_text(completion), **columns)


class VerdictCache:
    """Verdicts (the judge's raw answers) in one JSONL file, appended as they come; read once per
    process. Only answers are kept: a failed request is asked again next time."""

    _open: dict[str, "VerdictCache"] = {}

    def __init__(self, path: Path):
        self.path, self.lock, self.answers = path, threading.Lock(), {}
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                    self.answers[row["key"]] = row["answer"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut by a crash: that verdict is asked again

    @classmethod
    def at(cls, folder: str | None) -> "VerdictCache | None":
        if not folder:
            return None
        path = str(Path(folder) / "verdicts.jsonl")
        if path not in cls._open:
            Path(folder).mkdir(parents=True, exist_ok=True)
            cls._open[path] = cls(Path(path))
        return cls._open[path]

    def get(self, key: str) -> str | None:
        return self.answers.get(key)

    def put(self, key: str, answer: str) -> None:
        with self.lock:
            self.answers[key] = answer
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"key": key, "answer": answer}) + "\n")


def verdict_key(model: str, rubric: str, text: str) -> str:
    return hashlib.sha256(json.dumps([model, rubric, text]).encode("utf-8")).hexdigest()


def ask(base_url: str, model: str, text: str, api_key: str | None, timeout_s: float, retries: int,
        max_tokens: int) -> str | None:
    """The judge's answer to one rubric, or None once `retries` retries (with exponential backoff)
    have failed. A client error (4xx) is not retried: it would fail the same way."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                       "temperature": 0.0}).encode("utf-8")
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    for attempt in range(retries + 1):
        try:
            request = urllib.request.Request(f"{base_url.rstrip('/')}/chat/completions", body, headers)
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return json.loads(response.read())["choices"][0]["message"]["content"] or ""
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return None
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            pass  # unreachable, timed out, or not the API's answer
        if attempt < retries:
            time.sleep(min(0.25 * 2 ** attempt, 4.0))
    return None


def judge(completions, prompts=None, *, base_url: str, model: str, rubric: str, api_key_env: str | None = None,
          concurrency: int = 4, timeout_s: float = 30.0, retries: int = 2, max_tokens: int = 16,
          min_score: float = 0.0, max_score: float = 1.0, gate: str | None = None, gate_mode: str = "multiply",
          cache_dir: str | None = None, run_context=None, **columns) -> list[float | None]:
    """One verdict per completion (None: unparseable or unanswered), gated by a rule reward if set."""
    _check(rubric, gate_mode, concurrency, api_key_env, columns)
    api_key = os.environ.get(api_key_env) if api_key_env else None
    cache = VerdictCache.at(cache_dir or (run_context.cache_for("judge") if run_context else None))
    prompts = prompts if prompts is not None else [None] * len(completions)
    names = [k for k in columns if isinstance(columns[k], list) and len(columns[k]) == len(completions)]
    texts = [render(rubric, p, c, {k: columns[k][i] for k in names}) for i, (p, c) in enumerate(zip(prompts, completions))]
    keys = [verdict_key(model, rubric, t) for t in texts]
    answers = {k: cache.get(k) for k in keys} if cache else {}

    def one(i: int) -> str | None:
        answer = ask(base_url, model, texts[i], api_key, timeout_s, retries, max_tokens)
        if answer is not None and cache is not None:
            cache.put(keys[i], answer)
        return answer

    first = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    todo = [i for k, i in first.items() if answers.get(k) is None]  # one request per distinct text
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for i, answer in zip(todo, pool.map(one, todo)):
            answers[keys[i]] = answer
    scores = [None if answers.get(k) is None else parse_score(answers[k], min_score, max_score) for k in keys]
    return _gated(scores, gate, gate_mode, completions, prompts, columns) if gate else scores


def _gated(scores, gate: str, mode: str, completions, prompts, columns) -> list[float | None]:
    """multiply: rule x judge; replace: the judge's score where the rule gave more than 0, else the rule's."""
    rule = _load(gate)(completions=completions, prompts=prompts, **columns)
    if mode == "multiply":
        return [None if j is None else r * j for r, j in zip(rule, scores)]
    return [r if r <= 0 else j for r, j in zip(rule, scores)]


def _load(spec: str):
    """The gate's rule reward, `module:function` (rewards/ imports nothing of hindsight's)."""
    import importlib

    module, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(module), name, None) if name else None
    if not callable(fn):
        raise ValueError(f"gate: {spec!r} is not an importable module:function")
    return fn


def _check(rubric: str, gate_mode: str, concurrency: int, api_key_env, columns: dict) -> None:
    if "api_key" in columns:
        raise ValueError("api_key: a key never goes in the YAML; put it in an environment variable and name that "
                         "variable in api_key_env")
    if gate_mode not in GATE_MODES:
        raise ValueError(f"gate_mode: {gate_mode!r} is not one of {', '.join(GATE_MODES)}")
    if concurrency < 1:
        raise ValueError(f"concurrency: {concurrency} must be at least 1")
    if "{completion}" not in rubric:
        raise ValueError("rubric: it must hold {completion}, or the judge never sees what it scores")
    if api_key_env and api_key_env not in os.environ:
        raise ValueError(f"api_key_env: the environment variable {api_key_env} is not set")


def preflight(base_url: str = "", model: str = "", rubric: str = "", api_key_env: str | None = None,
              gate_mode: str = "multiply", concurrency: int = 4, gate: str | None = None, **args) -> None:
    """Before the run: the arguments make sense and the endpoint answers (`GET /models`) within
    seconds, so an unreachable judge is one error, not a run of fallback scores."""
    if not base_url or not model or not rubric:
        raise ValueError("base_url, model and rubric are required")
    _check(rubric, gate_mode, concurrency, api_key_env, args)
    if gate:
        _load(gate)
    api_key = os.environ.get(api_key_env) if api_key_env else None
    request = urllib.request.Request(f"{base_url.rstrip('/')}/models",
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=5.0) as response:
            response.read()
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConnectionError(f"the judge at {base_url} cannot be reached ({reason}); start it, or fix "
                              f"base_url") from None


judge.preflight = preflight
