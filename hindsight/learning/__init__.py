"""The learner.

The algorithms, the policy update, the critic, the learner group, and the SFT / reward-model /
negative-ft trainers.
"""
