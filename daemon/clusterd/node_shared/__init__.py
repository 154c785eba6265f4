"""What the daemon and the node program (`clusterd.agent`) share, and nothing else: the cluster
token's scheme, the agent API's revision and metadata keys, container image checks, log
offsets, and the node helper's typed commands.

The agent is a separate program shipped to nodes: the daemon's modules (but for its agent
client and the runtime that starts the agent) never import `clusterd.agent`; what both need
lives here. Runs on nodes, so it stays Python 3.10 code and imports no Ray or gRPC.
"""
