"""What the daemon and its agent agree on beside the protos: the API revision and the gRPC
metadata keys. Imports no gRPC, so either side (and the daemon's layers that never talk to the
agent) can read it cheaply."""

from __future__ import annotations

# Bumped when the agent's API changes incompatibly; the daemon checks it at connect time.
# 2: a Unix socket only, a token, and the Handshake call.
# 3: credentials over nonces the agent issues (IssueNonces), each good for one call.
AGENT_PROTOCOL = 3
# gRPC metadata key carrying the daemon's request id into the agent's log lines.
REQUEST_ID_METADATA = "x-clusterd-request-id"
# The caller's version: an agent of another version refuses every call but GetHealth, so a
# restarted (or replaced) agent can never serve a daemon it does not match.
VERSION_METADATA = "x-clusterd-version"
VERSION_MISMATCH_PREFIX = "AGENT_VERSION_MISMATCH:"
