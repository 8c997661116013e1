"""The RL run's coordinator.

RLRun and the roles it holds, prompts and replay, the async sampler, resume, the learner
group's peers and the Ray pools (placement, the only ray import), and `hindsight scale`.
"""
