"""The `kubernetes` provider: a pod per node, through kubernetes-asyncio."""

from clusterd.providers.kubernetes.provider import KubernetesProvider

__all__ = ["KubernetesProvider"]
