"""A stage is one declaration: what it reads, what it registers, and its story.

The declaration is the single source for three things that used to be written by hand in
each flow: the preflight (the data files and reward functions it reads are checked before
any model loads), the cache key (a change to anything it reads reruns it, a change to
anything else does not), and the registered model's name.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hindsight.config import PipelineConfig
from hindsight.data.rows import load_rows
from hindsight.errors import ConfigError, RewardError
from hindsight.fsutil import file_sha256
from hindsight.scoring.reward_fns import missing_columns
from hindsight.scoring.rewards import check_reward, reward_source_hash


def model_name(cfg: PipelineConfig, kind: str) -> str:
    """The registry name of a stage's output, e.g. NAME-sft; every caller builds it here."""
    return f"{cfg.name}-{kind}"


def model_uri(cfg: PipelineConfig, kind: str, alias: str = "latest") -> str:
    return f"models:/{model_name(cfg, kind)}@{alias}"


@dataclass(frozen=True, kw_only=True)
class StageContext:
    """What a story gets: the config, its resolved input models and its MLflow run."""
    cfg: PipelineConfig
    inputs: dict[str, str | None]          # config field -> local folder of the model it names
    run_id: str
    log: Callable[[dict, int], None]       # log(metrics, step) to the stage's run


@dataclass(frozen=True, kw_only=True)
class StageOutput:
    model_dir: Path                        # the checkpoint folder to register
    eval_accuracy: float | None = None
    then: Callable[[str], None] | None = None  # runs with the run id once the model is registered
    tags: dict[str, str] = field(default_factory=dict)  # on the registered version (a LoRA adapter's base)


@dataclass(frozen=True, kw_only=True)
class StageSpec:
    name: str                              # flow, task, MLflow run and cache-key name
    sections: tuple[str, ...]              # top-level config keys that decide its output
    models: Callable[[PipelineConfig], dict[str, str | None]]  # config field -> the model uri it reads (None: not read)
    data: tuple[str, ...] = ()             # DataConfig fields of the files it reads (columns in config.data.FILES)
    rewards: Callable[[PipelineConfig], list[str]] = lambda cfg: []  # 'module:function' it calls
    state: Callable[[PipelineConfig], Any] | None = None  # run-directory state it reads (stored shards)
    checks: Callable[[PipelineConfig], None] | None = None  # more preflight (e.g. that vLLM can run)
    code: Callable[[PipelineConfig], list[str]] = lambda cfg: []  # user code other than rewards (tools): hashed
    registers: str                         # kind: the stage registers NAME-<kind>
    story: Callable[[StageContext], StageOutput]

    @property
    def workdir(self) -> str:
        """Its folder under the run directory (`--force` moves it aside)."""
        return self.name.replace("-", "_")


@dataclass(frozen=True, kw_only=True)
class StageResult:
    stage: str
    model: str
    version: str
    run_id: str
    eval_accuracy: float | None
    wall_s: float
    cached: bool = False

    def row(self) -> dict:
        """The summary row (`--result-json`, sweeps): MLflow's metric name for the accuracy."""
        return {"stage": self.stage, "model": self.model, "version": self.version, "run_id": self.run_id,
                "eval/accuracy": self.eval_accuracy, "wall_s": self.wall_s, "cached": self.cached}


def preflight(spec: StageSpec, cfg: PipelineConfig) -> None:
    """Everything the stage declares it reads, checked in a second, before any model loads."""
    rows = {name: load_rows(**cfg.data.reading(name, limit=cfg.eval.limit if name == "eval" else None))
            for name in spec.data}
    for reward in spec.rewards(cfg):
        fn = check_reward(getattr(reward, "fn", reward), getattr(reward, "args", None))
        # a training reward (rl.scoring.rewards, with .fn) scores the prompts; a plain string is eval.reward
        file = "prompts" if hasattr(reward, "fn") else "eval"
        if rows.get(file):
            check_reward_columns(cfg, file, rows[file], getattr(reward, "fn", reward), fn, getattr(reward, "args", None))
    if spec.checks:
        spec.checks(cfg)


def check_reward_columns(cfg: PipelineConfig, file: str, rows: list[dict], spec: str, fn, args: dict | None) -> None:
    """A reward that requires a parameter no call passes (TRL passes the data's columns by name)
    would fail on every completion, found at the first step's scoring: one error now instead,
    with the columns the file has and the `data.columns` rename that fixes it."""
    columns = {k for r in rows for k in r} - {"prompt"}
    missing = missing_columns(fn, columns, args)
    if missing:
        have = ", ".join(sorted(columns)) or "none besides the prompt"
        source = next(iter(columns)) if len(columns) == 1 else "COLUMN"
        rename = ", ".join(f"{source}: {m}" for m in missing)
        raise RewardError(f"reward {spec!r} requires {', '.join(map(repr, missing))}, which is not a column of "
                          f"data.{file} ({getattr(cfg.data, file)}: it has {have}) nor one of the reward's args; "
                          f"rename a column to it with data.columns (e.g. {{{rename}}}), or give the parameter a "
                          f"default")


def check_models(paths: dict) -> None:
    """Every model the stage loads can be saved as it will be at each checkpoint: a quantized
    config or a config transformers refuses to write is one error naming the field, before any
    MLflow run starts and long before the first checkpoint (`models.savable`)."""
    from hindsight.models.savable import check_model_folder

    for name, path in paths.items():
        if path:
            check_model_folder(path, name)


def check_prompts(spec: StageSpec, cfg: PipelineConfig, paths: dict) -> None:
    """The prompts the stage samples from (`prompts`, `eval`) fit its input model: a prompt past
    `data.max_prompt_tokens` or the model's context is one error, before any MLflow run starts."""
    files = [name for name in spec.data if name in ("prompts", "eval")]
    field = next((k for k in ("rl.init", "model.base", "negative_ft.init") if paths.get(k)), None)
    if not files or field is None:
        return
    from transformers import AutoConfig

    from hindsight.data.bounds import check_prompt_lengths, prompt_cap
    from hindsight.data.template_guard import check_template
    from hindsight.models.load import load_tokenizer

    policy = paths[field]
    tok = load_tokenizer(policy)
    check_template(tok, f"{field}: {policy}")  # bounded, before the prompts below render through it
    context = getattr(AutoConfig.from_pretrained(policy), "max_position_embeddings", None)
    render = _multi_turn_render(spec, cfg, tok, policy)
    for name in files:
        new = cfg.rl.rollout.max_new_tokens if name == "prompts" else cfg.eval.max_new_tokens
        cap = prompt_cap(cfg.data.max_prompt_tokens, context, new)
        what = "data.max_prompt_tokens" if cfg.data.max_prompt_tokens else f"model's context ({context}, less {new} to generate)"
        rows = load_rows(**cfg.data.reading(name, limit=cfg.eval.limit if name == "eval" else None))
        check_prompt_lengths(rows, tok, cap, getattr(cfg.data, name), what, render)


def _multi_turn_render(spec: StageSpec, cfg: PipelineConfig, tok, policy: str):
    """For a multi-turn RL stage, how a trajectory's first prompt is rendered (through the chat
    template, with the tools' schemas, which can take hundreds of tokens), once the template is
    known to render tools; None for single-turn stages (`prompt_text`)."""
    mt = cfg.rl.rollout.multi_turn if spec.name == "rl" else None
    if mt is None:
        return None
    from hindsight.rollout.multiturn.render import first_prompt_text, template_problem
    from hindsight.rollout.multiturn.setup import tool_schemas

    if not mt.gym:  # tools are offered through the template: it must render them
        problem = template_problem(tok)
        if problem:
            raise ConfigError(f"rl.rollout.multi_turn.tools: {policy}: {problem}; use a model whose chat template "
                              f"supports tools (Qwen2.5-style), or a gym environment")
    elif not getattr(tok, "chat_template", None):  # a gym's turns are rendered by it too
        raise ConfigError(f"rl.rollout.multi_turn.gym: {policy}: the tokenizer has no chat template, and a "
                          f"multi-turn rollout renders every turn through it; use a chat model")
    return first_prompt_text(tok, tool_schemas(mt))


def cache_inputs(spec: StageSpec, cfg: PipelineConfig, model_versions: dict, data_md5: str) -> dict:
    """Everything the stage declares it reads, as plain values: the cache key hashes exactly this."""
    dumped = cfg.model_dump(mode="json", by_alias=True)
    return {"config": {s: str(cfg.root) if s == "run_dir" else dumped[s] for s in spec.sections},
            "models": model_versions, "data_md5": data_md5,
            "data_files": {n: _external_file_hash(cfg, getattr(cfg.data, n)) for n in spec.data},
            "rewards": {r: reward_source_hash(r) for r in (getattr(x, "fn", x) for x in spec.rewards(cfg))},
            "state": spec.state(cfg) if spec.state else None,
            # the multi-turn tools' and environments' source: not "code", which cache_key sets to the packages' hash
            **({"tool_code": {c: reward_source_hash(c) for c in code}} if (code := spec.code(cfg)) else {})}


def cache_key(spec: StageSpec, cfg: PipelineConfig, model_versions: dict, data_md5: str, store: str,
              code: str) -> str:
    """`store` names the MLflow store: a cached result points at a version registered there.
    `code` is the hash of the code that runs the stage (`code_version`)."""
    blob = json.dumps({"stage": spec.name, **cache_inputs(spec, cfg, model_versions, data_md5), "code": code,
                       "store": store}, sort_keys=True, default=str)
    return f"hindsight-{spec.name}-" + hashlib.sha256(blob.encode()).hexdigest()[:24]


def code_version(*packages) -> str:
    """Hash of the packages' source: a change to the code invalidates every cached stage."""
    h = hashlib.sha256()
    for pkg in packages:
        root = Path(pkg.__file__).parent
        for path in sorted(root.rglob("*.py")):
            h.update(f"{pkg.__name__}/{path.relative_to(root).as_posix()}".encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _external_file_hash(cfg: PipelineConfig, path: str) -> str | None:
    """Files inside the DVC-tracked data dir are covered by its md5; others are hashed here;
    procedural data is its spec (seed and split in it) and its generator's version."""
    from hindsight.data.procedural import is_procedural, version

    if is_procedural(path):
        return version(path)
    p, data_dir = Path(path).resolve(), Path(cfg.data.dir).resolve()
    if data_dir in p.parents or not p.is_file():
        return None
    return file_sha256(p)[:16]

