"""Fixtures the integration tests take by name."""

from tests.integration.agent_bed import agent, agent_cluster

__all__ = ["agent", "agent_cluster"]  # pytest finds fixtures in a conftest's namespace
