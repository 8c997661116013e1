"""Rollout engines: importing this package registers the built-in ones (`hf`, `vllm`);
`rl.rollout.backend` takes a registered name. `base.Engine` is the contract."""
from hindsight.rollout.engines import hf, vllm  # noqa: F401  (registration)
from hindsight.rollout.engines.base import (ENGINES, Engine, EngineContext, EngineSettings, get_engine,  # noqa: F401
                                            register, unregister)
