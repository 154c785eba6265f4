"""Name → provider, built once at start-up from the providers this daemon offers."""

from __future__ import annotations

from collections.abc import Iterable

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.providers.base import Provider

# Named in the docs and in SkyPilot task files, but not offered by this version yet.
PLANNED = ("kubernetes",)
# Where prices tie (your own machines cost nothing), this order decides.
PROVIDER_ORDER = ("local", "ssh", "aws", "kubernetes")


class ProviderRegistry:
    def __init__(self, providers: Iterable[Provider]) -> None:
        self._providers: dict[str, Provider] = {p.name: p for p in providers}

    def names(self) -> list[str]:
        return sorted(self._providers)

    def all(self) -> list[Provider]:
        return [self._providers[name] for name in self.names()]

    def get(self, name: str) -> Provider:
        provider = self._providers.get(name)
        if provider is not None:
            return provider
        if name in PLANNED:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED,
                f"the {name} provider is not available in this version of clusterd",
                f"available: {', '.join(self.names())}",
            )
        raise ProtocolError(
            ErrorCode.INVALID_ARGUMENT,
            f"unknown infra {name!r}",
            f"available: {', '.join(self.names())}",
        )
