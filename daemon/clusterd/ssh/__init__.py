"""SSH, owned by the daemon: one connection per node for every command, copy and tunnel."""
