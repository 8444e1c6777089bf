"""The one error type a user can cause while synthesizing the manifests."""


class ChartError(ValueError):
    """A job config or spec that the cluster cannot run; ``str(err)`` is the one line to print
    (file, field, bad value, what would be right)."""
