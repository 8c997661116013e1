"""One exception type for every bad input, so the CLI can print one clear line and exit non-zero."""


class HindsightError(Exception):
    """A user-facing error: the message names the file, line or field at fault."""


class ConfigError(HindsightError):
    pass


class DataError(HindsightError):
    pass


class RewardError(HindsightError):
    pass


class CheckpointError(HindsightError):
    pass
