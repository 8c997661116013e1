"""Policy losses: importing this package registers the built-in ones (`base.LOSSES`)."""
from hindsight.learning.losses import cispo, clip_cov, clipped, gmpo, gspo, kl_cov, luspo, sapo, vespo  # noqa: F401
from hindsight.learning.losses.base import LOSSES, LossInputs, LossSettings, PolicyLoss, get_loss  # noqa: F401
