"""The RL run's coordinator.

RLRun and the roles it holds, prompts and replay, the async sampler, resume, placement on Ray
(the only ray import), and the start of the learner group.
"""
