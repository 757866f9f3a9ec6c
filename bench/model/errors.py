"""The model's one error: run folders or fits that cannot give what was asked; the message
says why in one line."""


class FitError(ValueError):
    """A collectives run that cannot give the costs asked for; the message says why."""
