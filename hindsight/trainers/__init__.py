"""The SFT and reward-model stages' trainers: TRL's `SFTTrainer` and `RewardTrainer` on our data
and models (`supervised`), in this process or launched on several with accelerate (`launch`).
Apart from `learning/`, which is our own RL learner."""
