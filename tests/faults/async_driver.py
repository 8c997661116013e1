"""Run an RL stage's steps as flows/rl.py does (rollout -> score -> update), printing one JSON
line per step: python async_driver.py CONFIG.json INIT_PATH"""
import json
import sys

from hindsight.config import PipelineConfig
from hindsight.coordination.run import RLRun

cfg = PipelineConfig.model_validate(json.loads(open(sys.argv[1]).read()))
run = RLRun(cfg, sys.argv[2], None)
print(json.dumps({"start": run.start_step}), flush=True)
try:
    for step in range(run.start_step, cfg.rl.steps):
        _, rollout = run.rollout(step)
        run.score(step)
        run.update(step)
        print(json.dumps({"step": step, **{k: v for k, v in rollout.items() if isinstance(v, float)}}), flush=True)
finally:
    run.close()
