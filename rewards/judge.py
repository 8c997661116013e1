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

The completion goes to the judge between two markers that carry a random boundary (a marker
inside the completion is escaped, and so is any line of it that reads like a verdict), so the
judge can tell the answer it judges from the rubric around it. The verdict is exactly one line
`score: X` of the judge's own (with `response_format: json`, a JSON object `{"score": X}`), X in
[min_score, max_score], scaled to [0, 1]. An answer with no such line or with more than one, a
request that fails after its retries or runs past its deadline, gets None: the RL scorer gives
it the fallback and counts it (`reward/failures/judge`), and a judge that fails on every
completion stops the run (`rl.scoring.failure_stop`). Each request has one deadline, connect to
last byte, and a cap on the answer's size; a redirect to another origin is never followed
(`rewards/http.py`), so the key is only ever sent where `base_url` points.

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rewards import completion_text
from rewards.http import RequestFailed, request

_VERDICT = re.compile(r"^\s*\**score\**\s*[:=]\s*(-?\d+(?:\.\d+)?)\s*\**\s*$", re.IGNORECASE)
GATE_MODES = ("multiply", "replace")
MAX_ANSWER_BYTES = 1 << 20  # a judge's answer is a few lines; more is refused, not read


def parse_score(answer: str, min_score: float = 0.0, max_score: float = 1.0, boundary: str | None = None,
                json_format: bool = False) -> float | None:
    """The judge's one verdict scaled to [0, 1], or None: no verdict, more than one, or one
    outside [min_score, max_score] (a judge's answer is never guessed at). What the judge
    quotes of the completion between the boundary markers is not read."""
    text = _without_quote(answer or "", boundary)
    if json_format:
        value = _json_score(text)
    else:
        found = [m.group(1) for m in map(_VERDICT.match, lines(text)) if m]
        value = float(found[0]) if len(found) == 1 else None
    if value is None or not min_score <= value <= max_score:
        return None
    return (value - min_score) / (max_score - min_score)


def _json_score(text: str) -> float | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    value = obj.get("score") if isinstance(obj, dict) and set(obj) == {"score"} else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _without_quote(answer: str, boundary: str | None) -> str:
    if not boundary:
        return answer
    begin, end = _markers(boundary)
    while (a := answer.find(begin)) >= 0:
        b = answer.find(end, a)
        answer = answer[:a] + (answer[b + len(end):] if b >= 0 else "")
    return answer


def _markers(boundary: str) -> tuple[str, str]:
    return f"<<<ANSWER {boundary}>>>", f"<<<END OF ANSWER {boundary}>>>"


def lines(text: str) -> list[str]:
    """The one definition of a line, for the escaping and for the verdict alike: every break
    `str.splitlines` knows (\\r, \\x0b, \\x0c, \\x1c-\\x1e, \\x85, U+2028, U+2029 as well as \\n)."""
    return text.splitlines()


def delimited(completion: str, boundary: str) -> str:
    """The completion between its markers: a marker-like sequence inside it is escaped, and so
    is a line that reads like a verdict, so neither can pass for the judge's own. Its lines go to
    the judge joined by plain newlines, so a Unicode line break cannot hide a verdict line."""
    body = completion.replace("<<<", "<\\<<")
    body = "\n".join(f"\\{line}" if _VERDICT.match(line) else line for line in lines(body))
    begin, end = _markers(boundary)
    return f"{begin}\n{body}\n{end}"


def render(rubric: str, prompt, completion, columns: dict, boundary: str) -> str:
    """The rubric with `{prompt}`, `{completion}` (delimited) and the row's columns filled in; a
    chat prompt is shown one `role: content` line per turn."""
    if isinstance(prompt, list):
        prompt = "\n".join(f"{m.get('role')}: {m.get('content', '')}" for m in prompt if isinstance(m, dict))
    return rubric.format(prompt=prompt if prompt is not None else "",
                         completion=delimited(completion_text(completion), boundary), **columns)


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
        max_tokens: int, json_format: bool = False) -> str | None:
    """The judge's answer to one rubric, or None once `retries` retries (with exponential backoff)
    have failed; each attempt has `timeout_s` from connect to last byte. A client error (4xx), a
    refused redirect or an oversized answer is not retried: it would fail the same way."""
    payload = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
               "temperature": 0.0}
    if json_format:
        payload["response_format"] = {"type": "json_object"}
    body = json.dumps(payload).encode("utf-8")
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    for attempt in range(retries + 1):
        try:
            _, data = request("POST", f"{base_url.rstrip('/')}/chat/completions", body, headers, timeout_s,
                              MAX_ANSWER_BYTES)
            return json.loads(data)["choices"][0]["message"]["content"] or ""
        except RequestFailed as exc:
            if (exc.status is not None and 300 <= exc.status < 500) or "larger than" in str(exc):
                return None
        except (ValueError, KeyError, IndexError, TypeError):
            pass  # not the API's answer
        if attempt < retries:
            time.sleep(min(0.25 * 2 ** attempt, 4.0))
    return None


def judge(completions, prompts=None, *, base_url: str, model: str, rubric: str, api_key_env: str | None = None,
          concurrency: int = 4, timeout_s: float = 30.0, retries: int = 2, max_tokens: int = 16,
          min_score: float = 0.0, max_score: float = 1.0, gate: str | None = None, gate_mode: str = "multiply",
          cache_dir: str | None = None, run_context=None, response_format: str = "text",
          **columns) -> list[float | None]:
    """One verdict per completion (None: unparseable or unanswered), gated by a rule reward if set."""
    _check(rubric, gate_mode, concurrency, api_key_env, {**columns, "response_format": response_format})
    api_key = os.environ.get(api_key_env) if api_key_env else None
    cache = VerdictCache.at(cache_dir or (run_context.cache_for("judge") if run_context else None))
    prompts = prompts if prompts is not None else [None] * len(completions)
    names = [k for k in columns if isinstance(columns[k], list) and len(columns[k]) == len(completions)]
    # the boundary is derived from what it delimits (a completion cannot know it before it is
    # written), so the same text gives the same request and a cached verdict stays valid
    bounds = [hashlib.sha256(f"{model}|{completion_text(c)}".encode()).hexdigest()[:16] for c in completions]
    texts = [render(rubric, p, c, {k: columns[k][i] for k in names}, bounds[i])
             for i, (p, c) in enumerate(zip(prompts, completions))]
    keys = [verdict_key(model, rubric, t) for t in texts]
    json_format = response_format == "json"
    answers = {k: cache.get(k) for k in keys} if cache else {}

    def one(i: int) -> str | None:
        answer = ask(base_url, model, texts[i], api_key, timeout_s, retries, max_tokens, json_format)
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
    scores = [None if answers.get(k) is None else parse_score(answers[k], min_score, max_score, b, json_format)
              for k, b in zip(keys, bounds)]
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
    if columns.get("response_format", "text") not in ("text", "json"):
        raise ValueError(f"response_format: {columns['response_format']!r} is not one of text, json")
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
    try:
        request("GET", f"{base_url.rstrip('/')}/models", None,
                {"Authorization": f"Bearer {api_key}"} if api_key else {}, 5.0, MAX_ANSWER_BYTES)
    except RequestFailed as exc:
        raise ConnectionError(f"the judge at {base_url} cannot be reached ({exc}); start it, or fix "
                              f"base_url") from None


judge.preflight = preflight
