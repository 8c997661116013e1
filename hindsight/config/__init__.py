"""The config, split by YAML section (one module each), re-exported here: `load_config(path, overrides)`.

Flows take these models as parameters, so a Prefect deployment shows the same schema.
Every model forbids unknown keys: a typo fails at load time, naming the file, line and field.
"""
from hindsight.config.base import RewardSpec, Strict, flatten
from hindsight.config.data import DataConfig, EvalConfig, LoraConfig, ModelConfig
from hindsight.config.pipeline import PipelineConfig, ResourcesConfig, RetryConfig, TrackingConfig, load_config
from hindsight.config.learner import LearnerConfig
from hindsight.config.rl import (AlertRule, AsyncConfig, DynamicSamplingConfig, KLConfig, ReplayConfig, RLConfig,
                                 RoleResources, RolloutConfig, WorkersConfig, default_alerts)
from hindsight.config.scoring import RewardFnConfig, ScoringConfig
from hindsight.config.stages import NegativeFTConfig, RewardModelConfig, SFTConfig
from hindsight.errors import ConfigError

__all__ = ["AlertRule", "AsyncConfig", "ConfigError", "DataConfig", "DynamicSamplingConfig", "EvalConfig", "KLConfig",
           "LearnerConfig", "LoraConfig", "ModelConfig", "NegativeFTConfig", "PipelineConfig", "RLConfig",
           "ReplayConfig", "ResourcesConfig", "RetryConfig", "RewardFnConfig", "RewardModelConfig", "RewardSpec",
           "RoleResources", "RolloutConfig", "SFTConfig", "ScoringConfig", "Strict", "TrackingConfig", "WorkersConfig",
           "default_alerts", "flatten", "load_config"]
