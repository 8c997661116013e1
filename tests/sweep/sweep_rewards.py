"""A reward that breaks its contract at run time (wrong number of scores): the failing sweep trial."""


def wrong_length(completions, **_):
    return [0.0] * (len(completions) + 1)
