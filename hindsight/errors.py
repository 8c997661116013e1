"""One exception family for every user-facing failure, so the CLI prints one clear line and exits 1."""


class HindsightError(Exception):
    """A user-facing error: the message names the file, line or field at fault."""
    transient = False  # bad input fails the same way again: Prefect does not retry it


class ConfigError(HindsightError):
    pass


class DataError(HindsightError):
    pass


class RewardError(HindsightError):
    pass


class CheckpointError(HindsightError):
    pass


class StorageError(HindsightError):
    """A write failed (disk full, quota, permissions); the newest complete state is untouched."""


class StageError(HindsightError):
    """A stage failed after its retries; the message names the stage and the cause."""


class AlertStop(HindsightError):
    """An alert rule with `action: stop` fired; a resumable checkpoint was written first."""


class EarlyStopped(AlertStop):
    """A sweep trial whose fitted curve cannot reach the leader's stopped (`lookback.early_stop`)."""


class TrackingError(HindsightError):
    """The MLflow tracking server could not be reached; what it did not get is spooled."""


class NonFiniteError(HindsightError):
    """A loss, gradient or trained weight is not finite: the update was skipped, nothing is saved
    or registered."""


class Preempted(HindsightError):
    """SIGTERM or SIGINT: the step in flight finished and was checkpointed; rerun to resume."""

    def __init__(self, message: str, signum: int = 15):
        super().__init__(message)
        self.signum = signum
