"""Multi-process training for the TRL stages: `accelerate launch` from inside the stage task.

With `resources.num_processes > 1` the SFT and reward-model trainers run in N processes
started by `accelerate launch` (DDP by default, or the accelerate config named in
`resources.accelerate_config`, e.g. configs/accelerate/fsdp.yaml). `batch_size` stays the
global batch: each process takes batch_size / N, so the run trains on the same batches
as one process would. Rank 0 writes the metrics and the model; the task logs and registers
them as usual. On a CPU the same path runs with the gloo backend (the tests use 2 processes).

Usage inside the launch: python -m hindsight.trainers.launch ARGS.json
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from hindsight.errors import StageError
from hindsight.fsutil import append_line, atomic_write_json
from hindsight.registry import Registry

# stage -> its TRL trainer function, registered in its module (imported at the first lookup: TRL is heavy)
TRAINERS: Registry = Registry("trainer", built_in={"sft": "hindsight.trainers.supervised",
                                                   "reward-model": "hindsight.trainers.supervised"})


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def launch_command(num_processes: int, args_file: Path, accelerate_config: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if accelerate_config:
        cmd += ["--config_file", accelerate_config]
    else:  # DDP through torchrun; the trainers pick gloo themselves when there is no GPU
        cmd += ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd += ["--num_processes", str(num_processes), "--main_process_port", str(_free_port()),
            "-m", "hindsight.trainers.launch", str(args_file)]
    return cmd


def run_trainer(stage: str, kwargs: dict, num_processes: int = 1, accelerate_config: str | None = None,
                workdir: Path | None = None, log=None) -> dict:
    """Train in this process, or in `num_processes` launched ones; returns the trainer's metrics."""
    fn = TRAINERS.lookup(stage)
    if num_processes <= 1:
        return fn(**kwargs, log=log)
    workdir = Path(workdir or Path(kwargs["out_dir"]).parent / "launch")
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.jsonl", "result.json"):
        (workdir / name).unlink(missing_ok=True)
    args_file = workdir / "args.json"
    atomic_write_json(args_file, {"stage": stage, "kwargs": {k: _jsonable(v) for k, v in kwargs.items()},
                                  "workdir": str(workdir)})
    proc = subprocess.run(launch_command(num_processes, args_file, accelerate_config), capture_output=True, text=True)
    (workdir / "launch.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not (workdir / "result.json").exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise StageError(f"{stage}: accelerate launch with {num_processes} processes exited {proc.returncode}: "
                         f"{tail[0]} (log: {workdir / 'launch.log'})")
    if log is not None:
        for line in (workdir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            log(row["metrics"], row["step"])
    return json.loads((workdir / "result.json").read_text())


def main(args_file: str) -> None:
    spec = json.loads(Path(args_file).read_text())
    workdir = Path(spec["workdir"])
    kwargs = spec["kwargs"]
    if kwargs.get("lora"):  # the LoraConfig's fields, as the trainers read them (validated before the launch)
        from types import SimpleNamespace

        kwargs["lora"] = SimpleNamespace(**kwargs["lora"])

    def log(metrics: dict, step: int) -> None:
        if is_main_process():
            append_line(workdir / "metrics.jsonl", json.dumps({"step": step, "metrics": metrics}))

    # run as `-m hindsight.trainers.launch`, this module is __main__: the trainers register into the
    # module imported by its name, so look them up there
    from hindsight.trainers.launch import TRAINERS as registered

    result = registered.lookup(spec["stage"])(**kwargs, log=log)
    if is_main_process():
        atomic_write_json(workdir / "result.json", result)


def _jsonable(v):
    if hasattr(v, "model_dump"):
        return v.model_dump()
    return str(v) if isinstance(v, Path) else v


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main(sys.argv[1])
