"""The RL run's coordinator.

RLRun and the roles it holds, prompts and replay, the async sampler, resume, and placement on
Ray (the only ray import).
"""
