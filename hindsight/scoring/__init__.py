"""Scoring.

Reward functions and the guarded process they run in, the scorer (rewards, reference, reward
model), and evaluation.
"""
