"""The stage registry: one entry per stage, in pipeline order.

The CLI's `run` commands, the pipeline's order and prefect.yaml's deployments are generated from
it (`python -m flows.registry` rewrites prefect.yaml's deployments; a test checks they match), so
adding a stage is its flow file and one entry here. Entries name their flow and declaration by
import path, so reading the registry (the CLI's `--help`) imports no flow and no Prefect.
"""
from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Stage:
    name: str                                # `hindsight run NAME`, the flow's name, deployments NAME-local/-k8s
    flow: str                                # "module:function" of its Prefect flow
    help: str                                # the CLI command's help
    spec: str | None = None                  # "module:NAME" of its StageSpec; None for the pipeline itself
    in_pipeline: Callable | None = None      # cfg -> bool: whether the pipeline runs it; None: never
    resume_flags: bool = False               # takes --force-new-run (the RL state it would resume)

    def load_flow(self):
        return _load(self.flow)

    def load_spec(self):
        return _load(self.spec)


STAGES: list[Stage] = [
    Stage("sft", "flows.sft:sft_flow", "Supervised fine-tuning (TRL SFTTrainer); registers NAME-sft.",
          "flows.sft:SFT", lambda cfg: cfg.sft.enabled),
    Stage("reward-model", "flows.reward_model:reward_model_flow",
          "Pairwise reward model (TRL RewardTrainer) from NAME-sft; registers NAME-rm.",
          "flows.reward_model:REWARD_MODEL", lambda cfg: cfg.reward_model.enabled),
    Stage("rl", "flows.rl:rl_flow", "RL loop (rollout -> score -> update) from NAME-sft@latest; registers "
          "NAME-policy.\n\nRerunning on a run directory that holds state resumes from its newest checkpoint.",
          "flows.rl:RL", lambda cfg: True, resume_flags=True),
    Stage("negative-ft", "flows.negative_ft:negative_ft_flow",
          "Unlikelihood on the RL run's lowest-reward stored completions; registers NAME-negft.",
          "flows.negative_ft:NEGATIVE_FT", lambda cfg: cfg.negative_ft.enabled),
    Stage("pipeline", "flows.pipeline:pipeline_flow",
          "The whole chain: sft -> reward-model -> rl, skipping stages whose cache is valid.", resume_flags=True),
]
OTHER_FLOWS = {"sweep": "flows.sweep:sweep_flow"}  # deployed too, but run by a command of their own


def register(stage: Stage, before: str | None = None) -> None:
    """Add a stage (a plug-in, or a test's); `before` places it ahead of that stage in the order."""
    names = [s.name for s in STAGES]
    if before is not None and before not in names:
        raise KeyError(f"no stage {before!r} to place {stage.name!r} before")
    STAGES.insert(names.index(before or "pipeline"), stage)  # by default ahead of the pipeline, which stays last


def unregister(name: str) -> None:
    STAGES[:] = [s for s in STAGES if s.name != name]


def stage(name: str) -> Stage:
    return next(s for s in STAGES if s.name == name)


def pipeline_stages(cfg) -> list[Stage]:
    """The stages the pipeline runs for this config, in order."""
    return [s for s in STAGES if s.in_pipeline is not None and s.in_pipeline(cfg)]


def deployments() -> list[dict]:
    """prefect.yaml's deployments: every flow on the local process pool and the Kubernetes pool."""
    flows = {s.name: s.flow for s in STAGES} | OTHER_FLOWS
    order = ["pipeline"] + [n for n in flows if n != "pipeline"]
    helps = {s.name: s.help.split(";")[0].split(".")[0] for s in STAGES} | {"sweep": "Concurrent RL trials, ranked"}
    return [{"name": f"{name}-{pool}", "entrypoint": flows[name].replace(":", "."), "pool": pool,
             "description": helps[name]} for pool in ("local", "k8s") for name in order]


def deployment_lines() -> list[str]:
    lines = []
    for d in deployments():
        extra = ", pull: *k8s_pull" if d["pool"] == "k8s" else ""
        lines.append(f"  - {{name: {d['name']}, entrypoint: {d['entrypoint']}, work_pool: *{d['pool']}{extra},\n"
                     f"     description: \"{d['description']}\"}}")
    return lines


def write_prefect_yaml(path: Path) -> None:
    """Replace the deployments list in prefect.yaml (everything after `deployments:`)."""
    text = path.read_text()
    head = re.split(r"(?m)^deployments:\s*$", text)[0]
    note = "# generated from flows/registry.py (python -m flows.registry): edit the registry, not this list\n"
    path.write_text(head + "deployments:\n" + note + "\n".join(deployment_lines()) + "\n")


def _load(ref: str):
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


if __name__ == "__main__":
    write_prefect_yaml(Path(sys.argv[1] if len(sys.argv) > 1 else "prefect.yaml"))
