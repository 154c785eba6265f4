"""clusterd: the daemon that owns a user's clusters, and the agent it runs on their heads."""

from clusterctl._version import __version__

__all__ = ["__version__"]
