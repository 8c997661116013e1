"""The learner.

The algorithms, the policy update, the critic, one `LearnerRank` built the same on every rank of
the learner group and the strategies it holds (`strategies`: ddp, fsdp2 with its meta-device
start), rank 0's `Learner`, and the SFT / reward-model / negative-ft trainers.
"""
