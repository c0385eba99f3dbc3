"""The sweep's one error type for a problem the user can fix."""


class SweepError(Exception):
    """A problem the user can fix, reported as one line (e.g. a cluster too small)."""
