"""How to produce each bad input listed in docs/errors.md.

Each case writes what it needs under its own folder and returns the CLI arguments, extra
environment, and whether it may leave complete (never partial) state behind: a failure
after sampling keeps the shards it already finished, so a fixed rerun reuses them.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass
class Case:
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    keeps_state: bool = False
    starts_no_run: bool = False  # refused before any MLflow run starts (checked)


CASES = {}


def case(name):
    def register(fn):
        CASES[name] = fn
        return fn
    return register


def base_config(ws, run_dir: Path, **rl) -> dict:
    """An RL-only run on the demo data from a tiny model: seconds, not minutes."""
    data = ws.data
    return {
        "name": "errs", "seed": 0, "run_dir": str(run_dir),
        "data": {"dir": str(data), "dvc_file": None, "build_demo": False, "prompts": str(data / "prompts.jsonl"),
                 "eval": str(data / "eval.jsonl"), "sft": str(data / "sft.jsonl"), "prefs": str(data / "prefs.jsonl")},
        "sft": {"enabled": False}, "reward_model": {"enabled": False},
        "rl": {"init": str(ws.init), "steps": 2, "prompts_per_step": 2, "samples_per_prompt": 2, "save_every": 1,
               "rollout": {"max_new_tokens": 3}, "kl": {"coef": 0.0}, **rl},
        "eval": {"limit": 4, "max_new_tokens": 3},
        "retries": {"count": 1, "delay_s": 0},
    }


def write_config(tmp: Path, cfg: dict, name: str = "run.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def rl_args(path: Path, *extra: str) -> list[str]:
    return ["run", "rl", "-c", str(path.name), *extra]


def write_text_config(tmp: Path, text: str) -> Case:
    (tmp / "bad.yaml").write_text(text)
    return Case(["run", "rl", "-c", "bad.yaml"])


@case("yaml-malformed")
def _(ws, tmp):
    return write_text_config(tmp, "rl:\n  steps: 3\n  rollout: {max_new_tokens: 4\nseed: 1\n")


@case("config-missing")
def _(ws, tmp):
    return Case(["run", "rl", "-c", "nothere.yaml"])


@case("config-not-mapping")
def _(ws, tmp):
    return write_text_config(tmp, "- rl\n- sft\n")


@case("unknown-key")
def _(ws, tmp):
    return write_text_config(tmp, "name: errs\nrl:\n  stepz: 3\n")


@case("wrong-type")
def _(ws, tmp):
    return write_text_config(tmp, "rl:\n  steps: many\n")


@case("out-of-range")
def _(ws, tmp):
    return write_text_config(tmp, "rl:\n  samples_per_prompt: 1\n")


@case("bad-name")
def _(ws, tmp):
    return write_text_config(tmp, "name: my run\n")


@case("workers-zero")
def _(ws, tmp):
    return write_text_config(tmp, "rl:\n  workers:\n    rollout: 0\n")


@case("async-with-dynamic-sampling")
def _(ws, tmp):
    return write_text_config(tmp, "rl:\n  async: {max_staleness: 1}\n  dynamic_sampling: {enabled: true}\n")


@case("workers-too-many-cpus")
def _(ws, tmp):
    workers = {"placement": "ray", "rollout": 64, "resources": {"rollout": {"num_cpus": 1}}}
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run", workers=workers))))


@case("ray-unreachable")
def _(ws, tmp):
    workers = {"placement": "ray", "ray_address": "127.0.0.1:1"}
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run", workers=workers))))


@case("scale-not-a-run")
def _(ws, tmp):
    return Case(["scale", "nowhere", "--rollout", "2"])


@case("model-import-into-a-users-folder")
def _(ws, tmp):
    """OUT holds a user's code and a file named like the import's record (it was removed whole)."""
    (tmp / "m.gguf").write_bytes(b"GGUF")
    (tmp / "out" / "src").mkdir(parents=True)
    (tmp / "out" / "src" / "main.py").write_text("print('mine')\n")
    (tmp / "out" / "hindsight-import.json").write_text("{}")
    return Case(["model", "import", "m.gguf", "out"])


@case("model-import-record-edited")
def _(ws, tmp):
    """An earlier import whose record was rewritten to match an edited config.json."""
    import hashlib
    import json

    from hindsight.models.gguf import RECORD, signed_record

    (tmp / "m.gguf").write_bytes(b"GGUF")
    out = tmp / "out"
    out.mkdir()
    (out / "config.json").write_text('{"a": 1}')
    files = {"config.json": hashlib.sha256(b'{"a": 1}').hexdigest()}
    record = signed_record({"source": "m.gguf", "source_sha256": "0" * 64, "files": files})
    (out / "config.json").write_text('{"a": 2}')  # tampered, and the record rewritten to match, unsigned
    record["files"]["config.json"] = hashlib.sha256(b'{"a": 2}').hexdigest()
    (out / RECORD).write_text(json.dumps(record))
    return Case(["model", "import", "m.gguf", "out"])


@case("chat-template-memory-bomb")
def _(ws, tmp):
    """A model folder whose chat template asks for 3 GB (it was killed at an 8 GB cap after 99 s)."""
    model = tmp / "model"
    shutil.copytree(ws.init, model)
    (model / "chat_template.jinja").write_text("{{ 'x' * 3000000000 }}")
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run", init=str(model)))), starts_no_run=True)


@case("no-reward")
def _(ws, tmp):
    return write_text_config(tmp, "rl:\n  scoring: {rewards: []}\n")


@case("reward-spec")
def _(ws, tmp):
    return write_text_config(tmp, "rl:\n  scoring:\n    rewards:\n      - fn: rewards.exact\n")


@case("vllm-unavailable")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run")
    cfg["rl"]["rollout"] = {**cfg["rl"].get("rollout", {}), "backend": "vllm"}
    # the tests install vLLM's CPU build: this Python sees none, as a user without the extra
    return Case(rl_args(write_config(tmp, cfg)), env={"PYTHONPATH": str(Path(__file__).with_name("without_vllm"))})


@case("num-processes-for-rl")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run")
    cfg["resources"] = {"num_processes": 2}
    return Case(rl_args(write_config(tmp, cfg)))


@case("fsdp2-with-lora")
def _(ws, tmp):
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run", learner={"strategy": "fsdp2"},
                                                      lora={"enabled": True}))))


@case("set-syntax")
def _(ws, tmp):
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run")), "--set", "rl.steps"))


@case("set-unknown-key")
def _(ws, tmp):
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run")), "--set", "rl.stepz=3"))


def with_prompts(ws, tmp, filename: str, text: str | None) -> Case:
    cfg = base_config(ws, tmp / "run")
    if text is not None:
        (tmp / filename).write_text(text)
    cfg["data"]["prompts"] = filename
    return Case(rl_args(write_config(tmp, cfg)))


@case("data-missing")
def _(ws, tmp):
    return with_prompts(ws, tmp, "missing.jsonl", None)


@case("data-empty")
def _(ws, tmp):
    return with_prompts(ws, tmp, "empty.jsonl", "\n")


@case("jsonl-malformed")
def _(ws, tmp):
    return with_prompts(ws, tmp, "broken.jsonl", '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", \n')


@case("jsonl-not-object")
def _(ws, tmp):
    return with_prompts(ws, tmp, "list.jsonl", '["1+1=", "2"]\n')


@case("column-missing")
def _(ws, tmp):
    return with_prompts(ws, tmp, "nocol.jsonl", '{"question": "1+1=", "answer": "2"}\n')


@case("data-version")
def _(ws, tmp):
    data = tmp / "data"
    shutil.copytree(ws.data, data)
    with (data / "prompts.jsonl").open("a") as fh:
        fh.write(json.dumps({"prompt": "extra row", "answer": "1"}) + "\n")
    cfg = base_config(ws, tmp / "run")
    cfg["data"].update({"dir": "data", "dvc_file": str(ws.root / "data.dvc")})
    return Case(rl_args(write_config(tmp, cfg)))


@case("reward-unimportable")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run", scoring={"rewards": [{"fn": "no_such_module:score"}]})
    return Case(rl_args(write_config(tmp, cfg)))


@case("reward-not-a-function")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run", scoring={"rewards": [{"fn": "rewards.exact:no_such_fn"}]})
    return Case(rl_args(write_config(tmp, cfg)))


@case("reward-missing-column")
def _(ws, tmp):
    # TRL passes the data's columns by name: `answers` would be missing at every call
    (tmp / "col_reward.py").write_text("def score(completions, answers, **kw):\n    return [0.0] * len(completions)\n")
    cfg = base_config(ws, tmp / "run", scoring={"rewards": [{"fn": "col_reward:score"}]})
    return Case(rl_args(write_config(tmp, cfg)), {"PYTHONPATH": str(tmp)}, starts_no_run=True)


@case("reward-wrong-length")
def _(ws, tmp):
    (tmp / "short_reward.py").write_text("def short(completions, **kw):\n    return [1.0]\n")
    cfg = base_config(ws, tmp / "run", scoring={"rewards": [{"fn": "short_reward:short"}]})
    return Case(rl_args(write_config(tmp, cfg)), {"PYTHONPATH": str(tmp)}, keeps_state=True)


@case("model-path-missing")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run")
    cfg["sft"]["enabled"] = True
    cfg["model"] = {"base": "./models/nope"}
    return Case(["run", "sft", "-c", str(write_config(tmp, cfg).name)])


@case("init-path-missing")
def _(ws, tmp):
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run", init="/no/such/model"))))


@case("registry-alias-unknown")
def _(ws, tmp):
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run", init="models:/errs-sft@champion"))))


@case("registry-stage-not-run")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run")
    del cfg["rl"]["init"]
    cfg["name"] = "never-trained"
    return Case(rl_args(write_config(tmp, cfg)))


def stored_run(ws, tmp, **rl) -> Case:
    """A copy of a finished 2-step run: the checkpoints a rerun would resume from (its own run
    directory is a new cache key, so the stage runs; `--force` would move the state aside)."""
    shutil.copytree(ws.done_run, tmp / "run")
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run", **rl))))


@case("checkpoint-truncated")
def _(ws, tmp):
    c = stored_run(ws, tmp)
    for step in (1, 2):  # one intact version would be resumed from instead
        opt = tmp / f"run/rl/checkpoints/optimizer/step-{step:06d}.pt"
        opt.write_bytes(opt.read_bytes()[:100])
    return c


@case("weights-truncated")
def _(ws, tmp):
    c = stored_run(ws, tmp)
    for step in (1, 2):
        weights = tmp / f"run/rl/checkpoints/policy/step-{step:06d}/model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    return c


@case("key-both-ways")
def _(ws, tmp):
    return write_text_config(tmp, "name: errs\nrl:\n  lr: 0.1\n  learner: {lr: 0.2}\n")


@case("unknown-engine")
def _(ws, tmp):
    return write_text_config(tmp, "rl:\n  rollout: {backend: sglang}\n")


@case("resume-other-strategy")
def _(ws, tmp):
    """The stored run's learner was replicated (ddp): its optimizer state is one file, which a
    sharded learner cannot read, so the resume is refused before anything is written."""
    return stored_run(ws, tmp, steps=4, learner={"strategy": "fsdp2"})


@case("resume-finished-changed")
def _(ws, tmp):
    return stored_run(ws, tmp, learner={"lr": 5e-4})


@case("run-dir-home")
def _(ws, tmp):
    home = tmp / "home"
    (home / "docs").mkdir(parents=True)
    (home / "docs" / "thesis.md").write_text("years of work")
    return Case(rl_args(write_config(tmp, base_config(ws, home))), {"HOME": str(home)}, starts_no_run=True)


@case("run-dir-cwd")
def _(ws, tmp):
    return Case(rl_args(write_config(tmp, base_config(ws, Path(".")))), starts_no_run=True)


@case("run-dir-not-hindsights")
def _(ws, tmp):
    """A user's own folder: temporaries of their own tools, and an `rl/` folder that is theirs."""
    user = tmp / "projects"
    for rel in (".notes.md.tmp-4242", "docs/.report.tmp-77", "app/.build.tmp-1/out.o", "rl/mine.txt"):
        (user / rel).parent.mkdir(parents=True, exist_ok=True)
        (user / rel).write_text("the user's")
    return Case(rl_args(write_config(tmp, base_config(ws, user)), "--force"), starts_no_run=True)


@case("run-dir-mark-forged")
def _(ws, tmp):
    """A hand-written mark in a user's folder, naming a file outside it (its sweep once deleted
    the user's temporaries and a file beside the folder)."""
    user = tmp / "projects"
    for rel in ("rl/.notes.md.tmp-4242", "src/main.py"):
        (user / rel).parent.mkdir(parents=True, exist_ok=True)
        (user / rel).write_text("the user's")
    (user / ".hindsight-run").write_text('{"made": ["rl", "../../victim"]}')
    return Case(rl_args(write_config(tmp, base_config(ws, user))), starts_no_run=True)


@case("run-dir-mark-edited")
def _(ws, tmp):
    """A mark hindsight wrote, then edited by hand: its checksum no longer matches."""
    from hindsight.state.rundir import RunDir

    run = RunDir(tmp / "run").claim()
    run.record("rl")
    run.mark.write_text(run.mark.read_text().replace('"rl"', '"rl", "../victim"'))
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run"))), starts_no_run=True)


@case("run-dir-linked-folder")
def _(ws, tmp):
    """A run directory whose rl/ is a link to a folder elsewhere, with that folder's temporaries."""
    from hindsight.state.rundir import RunDir

    (tmp / "elsewhere").mkdir()
    (tmp / "elsewhere" / ".keep.tmp-4242").write_text("not the run's")
    run = RunDir(tmp / "run").claim()
    run.record("rl")
    (tmp / "run" / "rl").symlink_to(tmp / "elsewhere")
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run"))), starts_no_run=True)


@case("run-dir-nested")
def _(ws, tmp):
    """A run directory inside another run's rl/ (the outer run's next start deleted the inner
    run's temporary file while its writer was alive)."""
    from hindsight.state.rundir import RunDir

    outer = RunDir(tmp / "outer").claim()
    outer.record("rl").mkdir()
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "outer" / "rl" / "inner"))), starts_no_run=True)


BOMB = "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x]"] +
                 [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)])


@case("yaml-nodes-bomb")
def _(ws, tmp):
    """9 levels of 9 aliases: 72 aliases, under the alias cap, and 387 million nodes expanded."""
    return Case(write_text_config(tmp, f"name: errs\nbomb:\n  {BOMB.replace(chr(10), chr(10) + '  ')}\n").args,
                starts_no_run=True)


@case("set-alias-bomb")
def _(ws, tmp):
    flow = "{" + ", ".join(BOMB.split("\n")).replace(": &", ": &") + "}"
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run")), "--set", f"rl.note={flow}"),
                starts_no_run=True)


@case("set-duplicate-key")
def _(ws, tmp):
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run")), "--set", "rl.kl={coef: 0.1, coef: 0.2}"),
                starts_no_run=True)


@case("yaml-too-deep")
def _(ws, tmp):
    return Case(write_text_config(tmp, "name: errs\nrl: " + "[" * 50_000 + "]" * 50_000 + "\n").args,
                starts_no_run=True)


@case("config-too-large")
def _(ws, tmp):
    return Case(write_text_config(tmp, "name: errs\nnote: " + "x" * (2 << 20) + "\n").args, starts_no_run=True)


@case("yaml-scalar-too-long")
def _(ws, tmp):
    return Case(write_text_config(tmp, "name: errs\nrl:\n  init: " + "x" * (100 << 10) + "\n").args,
                starts_no_run=True)


@case("prompt-too-long")
def _(ws, tmp):
    """A 15 MiB prompt (under the JSONL line cap) once took 6.1 GB and then tried 60 GB in evaluation."""
    (tmp / "long.jsonl").write_text(json.dumps({"prompt": "Ann has 4 pens. " * ((15 << 20) // 16), "answer": "7"}) + "\n")
    cfg = base_config(ws, tmp / "run")
    cfg["data"]["prompts"] = str(tmp / "long.jsonl")
    return Case(rl_args(write_config(tmp, cfg)), starts_no_run=True)


@case("parquet-huge-field")
def _(ws, tmp):
    """10 KB on disk, one 300 MB string inside: refused from its metadata, before it is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["x" * (300 << 20)], "answer": ["7"]}), tmp / "big.parquet", compression="zstd")
    cfg = base_config(ws, tmp / "run")
    cfg["data"]["prompts"] = str(tmp / "big.parquet")
    return Case(rl_args(write_config(tmp, cfg)), starts_no_run=True)


@case("parquet-too-deep")
def _(ws, tmp):
    """A column nested 200 deep (a traceback before): pyarrow refuses its footer, and so do we, in one line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pa.int64()
    for _ in range(200):
        t = pa.list_(t)
    pq.write_table(pa.table({"prompt": pa.array([None], type=t)}), tmp / "deep.parquet")
    cfg = base_config(ws, tmp / "run")
    cfg["data"]["prompts"] = str(tmp / "deep.parquet")
    return Case(rl_args(write_config(tmp, cfg)), starts_no_run=True)


@case("run-locked")
def _(ws, tmp):
    (tmp / "run").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom hindsight.state.runlock import run_lock\n"
                               "with run_lock(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.read()\n",
                               str(tmp / "run")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ws.root)})
    assert holder.stdout.readline().strip() == "held"
    _HOLDERS.append(holder)  # released when the test process ends (its stdin closes)
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run"))))


_HOLDERS: list = []


@case("mlflow-unreachable")
def _(ws, tmp):
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run"))), {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})


@case("config-is-a-directory")
def _(ws, tmp):
    (tmp / "conf.yaml").mkdir()
    return Case(["run", "rl", "-c", "conf.yaml"])


@case("config-binary")
def _(ws, tmp):
    (tmp / "model.yaml").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00")
    return Case(["run", "rl", "-c", "model.yaml"])


@case("config-not-utf8")
def _(ws, tmp):
    (tmp / "latin.yaml").write_bytes(b"name: errs\nseed: 0 # caf\xe9\n")
    return Case(["run", "rl", "-c", "latin.yaml"])


@case("set-malformed-yaml")
def _(ws, tmp):
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run")), "--set", "rl.rollout={max_new_tokens: 4"))


def _prompts_case(ws, tmp, content: bytes) -> Case:
    (tmp / "prompts.jsonl").write_bytes(content)
    cfg = base_config(ws, tmp / "run")
    cfg["data"]["prompts"] = str(tmp / "prompts.jsonl")
    return Case(rl_args(write_config(tmp, cfg)))


@case("data-not-utf8")
def _(ws, tmp):
    return _prompts_case(ws, tmp, b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "1"}\n')


@case("prompt-not-text")
def _(ws, tmp):
    return _prompts_case(ws, tmp, b'{"prompt": "2 + 2", "answer": "4"}\n{"prompt": 42, "answer": "4"}\n')


@case("prompt-lone-surrogate")
def _(ws, tmp):
    return _prompts_case(ws, tmp, b'{"prompt": "2 + 2 \\ud800", "answer": "4"}\n')


def _reward_case(ws, tmp, body: str, isolation: str) -> Case:
    (tmp / "bad_returns.py").write_text(f"def score(completions, **kw):\n    {body}\n")
    cfg = base_config(ws, tmp / "run", scoring={"rewards": [{"fn": "bad_returns:score"}], "isolation": isolation})
    return Case(rl_args(write_config(tmp, cfg)), {"PYTHONPATH": str(tmp)}, keeps_state=True)


@case("reward-returns-string")
def _(ws, tmp):
    return _reward_case(ws, tmp, "return '1' * len(completions)", "process")


@case("reward-returns-dict")
def _(ws, tmp):
    return _reward_case(ws, tmp, "return {c: 1.0 for c in completions}", "inline")


@case("reward-exits")
def _(ws, tmp):
    return _reward_case(ws, tmp, "import sys; sys.exit(0)", "inline")


@case("sandbox-mode-unknown")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run", scoring={"rewards": [{"fn": "rewards.code:code_tests", "args": {"sandbox": "docker"}}]})
    return Case(rl_args(write_config(tmp, cfg)))


@case("manifest-corrupt")
def _(ws, tmp):
    c = stored_run(ws, tmp)
    (tmp / "run/rl/checkpoints/manifest.json").write_text('{"step": 2,')
    return c


@case("resume-incompatible")
def _(ws, tmp):
    return stored_run(ws, tmp, samples_per_prompt=4)


@case("disk-full")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run")
    return Case(rl_args(write_config(tmp, cfg)), {"HINDSIGHT_FAULT": "disk_full:rollouts/step-000002",
                                                "HINDSIGHT_NO_SPACE_WAIT_S": "2"},
                keeps_state=True)


@case("master-weights-bf16")
def _(ws, tmp):
    return write_text_config(tmp, "name: errs\nmodel:\n  master_dtype: bfloat16\n")


@case("mini-batch-partial-group")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run", learner={"mini_batch_size": 3})
    return Case(rl_args(write_config(tmp, cfg)))


@case("loss-unknown")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run", learner={"loss": "gpo"})
    return Case(rl_args(write_config(tmp, cfg)))


@case("loss-setting-of-another-loss")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run", learner={"loss": "grpo", "grpo": {"temperature_pos": 2.0}})
    return Case(rl_args(write_config(tmp, cfg)))


@case("loss-block-not-chosen")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run", learner={"loss": "grpo", "sapo": {"temperature_pos": 2.0}})
    return Case(rl_args(write_config(tmp, cfg)))


@case("loss-sequence-with-token-advantages")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run", algorithm="reinforce_pp", learner={"loss": "gspo"})
    return Case(rl_args(write_config(tmp, cfg)))


@case("loss-correction-level-refused")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run", learner={"loss": "vespo", "correction": {"level": "sequence"}})
    return Case(rl_args(write_config(tmp, cfg)))


@case("tiny-model-unknown")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run", init="tiny://nope")
    return Case(rl_args(write_config(tmp, cfg)))


@case("config-empty")
def _(ws, tmp):
    return write_text_config(tmp, "")


@case("yaml-duplicate-key")
def _(ws, tmp):
    return write_text_config(tmp, "name: errs\nrl:\n  steps: 2\n  steps: 3\n")


@case("yaml-alias-bomb")
def _(ws, tmp):
    chain = "name: errs\na: &a [1, 2]\nb: &b [" + ", ".join(["*a"] * 10) + "]\nc: &c [" + ", ".join(["*b"] * 10) + "]\n"
    return write_text_config(tmp, chain + "d: [" + ", ".join(["*c"] * 90) + "]\n")


@case("config-non-finite")
def _(ws, tmp):
    return write_text_config(tmp, "name: errs\nrl:\n  learner:\n    lr: .inf\n")


@case("reward-signature")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run", scoring={"rewards": [{"fn": "os:system"}]})
    return Case(rl_args(write_config(tmp, cfg)))


@case("reward-fails-everywhere")
def _(ws, tmp):
    """The reported failure: the reward's column was renamed away, every call raised, and the
    run still registered a policy. A named parameter is caught at preflight (reward-missing-column);
    one read from **kw only shows when the reward runs."""
    (tmp / "needs_column.py").write_text("def needs_solution(completions, **kw):\n"
                                         "    return [float(c == s) for c, s in zip(completions, kw['solution'])]\n")
    cfg = base_config(ws, tmp / "run", scoring={"rewards": [{"fn": "needs_column:needs_solution"}]})
    return Case(rl_args(write_config(tmp, cfg)), {"PYTHONPATH": str(tmp)}, keeps_state=True)


@case("columns-not-a-file")
def _(ws, tmp):
    return write_text_config(tmp, "name: errs\ndata:\n  columns:\n    rl: {question: prompt}\n")


@case("system-prompt-without-chat")
def _(ws, tmp):
    return write_text_config(tmp, "name: errs\ndata:\n  system_prompt: Be brief.\n")


@case("demo-into-user-folder")
def _(ws, tmp):
    (tmp / "data").mkdir()
    (tmp / "data" / "mine.jsonl").write_text('{"prompt": "mine"}\n')
    cfg = base_config(ws, tmp / "run")
    cfg["data"] = {"dir": "data", "dvc_file": None}  # the defaults: data/prompts.jsonl and so on, the demo's
    return Case(rl_args(write_config(tmp, cfg)), keeps_state=True)


@case("judge-unreachable")
def _(ws, tmp):
    judge = {"fn": "rewards.judge:judge", "args": {"base_url": "http://127.0.0.1:1/v1", "model": "judge",
                                                   "rubric": "{prompt} {completion}: reply score: 1 or 0"}}
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run", scoring={"rewards": [judge]}))))


@case("judge-key-in-yaml")
def _(ws, tmp):
    judge = {"fn": "rewards.judge:judge", "args": {"base_url": "http://127.0.0.1:1/v1", "model": "judge",
                                                   "rubric": "{completion}", "api_key": "sk-not-here"}}
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run", scoring={"rewards": [judge]}))))


@case("jsonl-line-too-long")
def _(ws, tmp):
    (tmp / "long.jsonl").write_text(json.dumps({"prompt": "x" * (17 << 20)}) + "\n")
    cfg = base_config(ws, tmp / "run")
    cfg["data"]["prompts"] = str(tmp / "long.jsonl")
    return Case(rl_args(write_config(tmp, cfg)))


@case("jsonl-too-deep")
def _(ws, tmp):
    (tmp / "deep.jsonl").write_text('{"prompt": "a", "x": ' + "[" * 5000 + "]" * 5000 + "}\n")
    cfg = base_config(ws, tmp / "run")
    cfg["data"]["prompts"] = str(tmp / "deep.jsonl")
    return Case(rl_args(write_config(tmp, cfg)))


@case("run-dir-system-folder")
def _(ws, tmp):
    os.symlink("/", tmp / "root-link")
    cfg = base_config(ws, tmp / "root-link")
    return Case(rl_args(write_config(tmp, cfg)))


@case("rl-diverges")
def _(ws, tmp):
    """rl.lr: .inf is refused as a config float; a finite lr that diverges is stopped at the step."""
    (tmp / "varied_reward.py").write_text("def varied(completions, **kw):\n    return [float(len(c) % 3) for c in completions]\n")
    cfg = base_config(ws, tmp / "run", learner={"lr": 1e30}, steps=4, scoring={"rewards": [{"fn": "varied_reward:varied"}]})
    return Case(rl_args(write_config(tmp, cfg)), {"PYTHONPATH": str(tmp)}, keeps_state=True)


@case("sft-diverges")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run")
    cfg["sft"] = {"enabled": True, "lr": 1e30, "max_steps": 3, "batch_size": 8, "max_length": 32}
    cfg["model"] = {"base": str(ws.init)}
    return Case(["run", "sft", "-c", str(write_config(tmp, cfg).name)], keeps_state=True)


def _model_copy(ws, tmp, edit) -> Case:
    """The tiny init model copied, one of its files edited: a folder that loads."""
    model = tmp / "model"
    shutil.copytree(ws.init, model)
    edit(model)
    return Case(rl_args(write_config(tmp, base_config(ws, tmp / "run", init=str(model)))), starts_no_run=True)


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**data, **changes}))


@case("quantized-config")
def _(ws, tmp):
    return _model_copy(ws, tmp, lambda m: _edit_json(m / "config.json", quantization_config={"quant_method": "gguf"}))


@case("model-not-savable")
def _(ws, tmp):
    return _model_copy(ws, tmp, lambda m: _edit_json(m / "generation_config.json", num_return_sequences=3))


@case("gguf-not-a-model")
def _(ws, tmp):
    (tmp / "notes.gguf").write_bytes(b"these are my notes, not a model\n" * 64)
    cfg = base_config(ws, tmp / "run", init=str(tmp / "notes.gguf"))
    return Case(rl_args(write_config(tmp, cfg)), starts_no_run=True)


@case("reward-name-collides")
def _(ws, tmp):
    (tmp / "rewards").mkdir()
    (tmp / "rewards" / "math_reward.py").write_text("def score(completions, **kw):\n    return [0.0] * len(completions)\n")
    cfg = base_config(ws, tmp / "run", scoring={"rewards": [{"fn": "rewards.math_reward:score"}]})
    return Case(rl_args(write_config(tmp, cfg)), starts_no_run=True)


@case("procedural-split")
def _(ws, tmp):
    cfg = base_config(ws, tmp / "run")
    cfg["data"]["prompts"] = "rg://chain_sum?size=8&seed=1&holdout=0.2"
    return Case(rl_args(write_config(tmp, cfg)), starts_no_run=True)


def _procedural(ws, tmp, spec: str) -> Case:
    cfg = base_config(ws, tmp / "run")
    cfg["data"]["prompts"] = spec
    return Case(rl_args(write_config(tmp, cfg)), starts_no_run=True)


@case("procedural-size-cap")
def _(ws, tmp):
    return _procedural(ws, tmp, "rg://chain_sum?size=1000000000&seed=1")


@case("procedural-holdout-cap")
def _(ws, tmp):
    return _procedural(ws, tmp, "rg://chain_sum?size=4&seed=1&holdout=1e-7&split=eval")


@case("procedural-setting-cap")
def _(ws, tmp):
    return _procedural(ws, tmp, "rg://chain_sum?size=4&seed=1&max_digits=1e308")


def _multi_turn(ws, tmp, **multi_turn) -> Case:
    # the multi-turn unit tests' tools and environments, as a user's module beside the config
    shutil.copy(ws.root / "tests/unit/rollout/multiturn_envs/games.py", tmp / "mytools.py")
    cfg = base_config(ws, tmp / "run", rollout={"max_new_tokens": 3, "multi_turn": multi_turn})
    return Case(rl_args(write_config(tmp, cfg)), starts_no_run=True)


@case("tool-no-type-hints")
def _(ws, tmp):
    return _multi_turn(ws, tmp, tools=["mytools:no_hints"], isolation="in_process")


@case("tool-no-docstring")
def _(ws, tmp):
    return _multi_turn(ws, tmp, tools=["mytools:no_docstring"], isolation="in_process")


@case("environment-no-reset")
def _(ws, tmp):
    return _multi_turn(ws, tmp, environment="mytools:NoReset")


@case("template-without-tools")
def _(ws, tmp):
    return _multi_turn(ws, tmp, tools=["mytools:add"])


@case("gym-without-template")
def _(ws, tmp):
    return _multi_turn(ws, tmp, gym="mytools:GuessNumber")
