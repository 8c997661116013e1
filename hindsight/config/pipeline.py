"""The whole config: every section, run-wide settings (tracking, resources, retries), and
`load_config(path, overrides)`."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError, field_validator, model_validator

from hindsight.errors import ConfigError
from hindsight.config.yamlfile import describe_errors, read_yaml_mapping
from hindsight.config.base import Strict
from hindsight.config.data import DataConfig, EvalConfig, ModelConfig
from hindsight.config.lookback import LookbackConfig
from hindsight.config.rl import RLConfig
from hindsight.config.stages import NegativeFTConfig, RewardModelConfig, SFTConfig
from hindsight.state.rundir import system_folder_problem


class TrackingConfig(Strict):
    experiment: str = "hindsight"
    tracking_uri: str | None = Field(None, description="default: $MLFLOW_TRACKING_URI, else sqlite in the cwd")


class ResourcesConfig(Strict):
    num_processes: int = Field(1, ge=1, description="> 1: SFT and the reward model train under `accelerate launch` "
                                                    "with this many processes (batch_size stays the global batch); "
                                                    "the RL stage's processes are rl.learner.processes")
    accelerate_config: str | None = Field(None, description="accelerate config file, e.g. configs/accelerate/fsdp.yaml; "
                                                            "default: DDP")
    threads: int | None = Field(None, ge=1, description="torch intra-op threads of a stage's process; default: the "
                                                        "CPUs it may use (affinity mask, cgroup CPU quota)")


class RetryConfig(Strict):
    count: int = Field(1, ge=0)
    delay_s: float = Field(2.0, ge=0)


class PipelineConfig(Strict):
    name: str = Field("demo", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    seed: int = 0
    run_dir: str | None = Field(None, description="default: runs/<name>")
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig)
    rl: RLConfig = Field(default_factory=RLConfig)
    negative_ft: NegativeFTConfig = Field(default_factory=NegativeFTConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    lookback: LookbackConfig = Field(default_factory=LookbackConfig)
    retries: RetryConfig = Field(default_factory=RetryConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)

    @field_validator("run_dir")
    @classmethod
    def _not_a_system_folder(cls, value: str | None) -> str | None:
        if value is not None:
            refuse_system_folder(Path(value))
        return value

    @model_validator(mode="after")
    def _default_run_dir(self):
        refuse_system_folder(self.root)  # runs/NAME may be a symlink too
        return self

    @model_validator(mode="after")
    def _batches_divide(self):
        n = self.resources.num_processes
        if n > 1 and "processes" not in self.rl.learner.model_fields_set:
            # it used to relaunch `accelerate launch` for every RL update, with every rank holding
            # the whole model: the learner group replaced it, and it must not be dropped silently
            raise ValueError(f"resources.num_processes: {n} trains only sft and reward_model now; the RL stage trains "
                             f"on several processes as a learner group: set rl.learner.processes: {n} (with "
                             f"rl.workers.placement: ray, and rl.learner.strategy: fsdp2 to shard the model), or "
                             f"rl.learner.processes: 1 to train RL in one process")
        for key, batch in (("sft.batch_size", self.sft.batch_size), ("reward_model.batch_size", self.reward_model.batch_size)):
            if batch % n:
                raise ValueError(f"{key} {batch} does not divide over resources.num_processes {n}")
        return self

    @property
    def root(self) -> Path:
        return Path(self.run_dir or f"runs/{self.name}")


def beside_the_config(path: Path) -> None:
    """The config's folder at the end of the import path, hindsight's own reward package bound
    first: a folder of the user's named `rewards/` (a namespace package, no __init__.py) would
    otherwise take the name from an editable install's finder, and with it the built-in rewards."""
    import importlib
    import sys

    importlib.import_module("rewards")  # by name: the config layer never imports a reward itself
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)


def refuse_system_folder(path: Path) -> None:
    """At load time already: never `/` or a system folder (the run directory's own claim refuses
    the home folder, the working directory and a folder that is not hindsight's, `state.rundir`)."""
    problem = system_folder_problem(path)
    if problem:
        raise ValueError(problem)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = (), smoke: bool = False) -> PipelineConfig:
    """The config at `path`, its folder made importable: a reward module beside the config
    (`fn: my_rewards:score`, the file my_rewards.py next to it) imports without PYTHONPATH, in
    this process and in the ones it starts (the reward worker, Ray actors, the async sampler).
    `smoke` applies the file's smoke-size preset (its `smoke:` block) before `overrides`."""
    raw, text = read_yaml_mapping(path, overrides, smoke=smoke)
    beside_the_config(Path(path))
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc, Path(path), text)) from None
