"""Name → provider, built once at start-up from the providers this daemon offers
(providers/offered.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from clusterctl.protocol import ErrorCode, ProtocolError, shown
from clusterd.providers.base import Provider, ProviderOf


class ProviderRegistry:
    """The daemon's providers by name. Each is given back as a `Provider` (its handles typed
    as ProviderHandle): the services hand it only handles read back under its own name (the
    store decodes a record's handle by the record's provider), or made by itself."""

    def __init__(self, providers: Iterable[ProviderOf[Any]],
                 planned: Iterable[str] = ()) -> None:
        """`providers` in the order of preference where places cost the same; `planned`:
        names users may write that this version does not offer (refused as such)."""
        self._providers: dict[str, ProviderOf[Any]] = {p.name: p for p in providers}
        self._preference = {name: index for index, name in enumerate(self._providers)}
        self._planned = frozenset(planned)

    def names(self) -> list[str]:
        return sorted(self._providers)

    def all(self) -> list[Provider]:
        return [self._providers[name] for name in self.names()]

    def honoured_fields(self, name: str) -> frozenset[str]:
        """The provider-dependent task fields `name` honours (none for a provider not offered
        here: its clusters are refused wherever the provider itself is needed)."""
        provider = self._providers.get(name)
        return provider.honoured_fields if provider is not None else frozenset()

    def preference(self, name: str) -> int:
        """Where prices tie, the lower goes first (an unknown name last)."""
        return self._preference.get(name, len(self._preference))

    def get(self, name: str) -> Provider:
        provider = self._providers.get(name)
        if provider is not None:
            return provider
        if name in self._planned:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED,
                f"the {name} provider is not available in this version of clusterd",
                f"available: {', '.join(self.names())}",
            )
        raise ProtocolError(
            ErrorCode.INVALID_ARGUMENT,
            f"unknown infra {shown(name, 40)}",
            f"available: {', '.join(self.names())}",
        )
