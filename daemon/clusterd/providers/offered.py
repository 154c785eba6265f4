"""The providers this clusterd offers: the one list a new provider is added to.

Each entry is a provider class; the daemon builds one instance of each from a
`ProviderContext` (`build`), and everything else it needs to know of a provider it asks the
provider (see the Protocol in providers/base.py). Their order here is the order of preference
where places cost the same: your own machines first, since they cost nothing.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from clusterd.providers.aws import AWSProvider
from clusterd.providers.base import ProviderContext, ProviderOf
from clusterd.providers.kubernetes import KubernetesProvider
from clusterd.providers.loadtest import LoadTestProvider
from clusterd.providers.local import LocalProvider
from clusterd.providers.registry import ProviderRegistry
from clusterd.providers.ssh import SSHProvider
from clusterd.tasks import fields
from clusterd.tasks.overrides import cli_markdown

OFFERED: tuple[type[ProviderOf[Any]], ...] = (
    LocalProvider,
    SSHProvider,
    AWSProvider,
    KubernetesProvider,
)
# Built only when CLUSTERD_TEST_PROVIDERS names them (benchmarks, scale tests): never for users.
TEST_ONLY: tuple[type[ProviderOf[Any]], ...] = (LoadTestProvider,)
# Named in the docs and in SkyPilot task files, but not offered by this version yet: refused
# as "not available in this version" rather than as an unknown infra.
PLANNED: tuple[str, ...] = ()


def build_providers(context: ProviderContext,
                    test_providers: Collection[str] = ()) -> ProviderRegistry:
    """One instance of every offered provider (and of the test-only ones named)."""
    classes = [*OFFERED, *(c for c in TEST_ONLY if c.name in test_providers)]
    return ProviderRegistry([cls.build(context) for cls in classes], planned=PLANNED)


def fields_page() -> str:
    """docs/skypilot-compatibility.md (scripts/gen-docs): the table of task fields, with the
    offered providers that honour each field that applies on some only."""
    page = fields.markdown({cls.name: cls.honoured_fields for cls in OFFERED})
    return page + "\n" + "\n".join(cli_markdown())
