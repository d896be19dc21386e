"""Errors the CLI answers with one line and exit status 1 (besides ValueError/OSError)."""


class RoundFailedError(RuntimeError):
    """Fewer clients than federation.min_clients succeeded in a round, after its retries."""


class RunDirInUseError(RuntimeError):
    """Another fit is running into the same run.dir (its lock file names the process)."""
