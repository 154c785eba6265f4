"""The Kubernetes API, per kubeconfig context: clients loaded the standard way (`KUBECONFIG`,
else `~/.kube/config`), each context's namespace, and calls retried on 429 and 5xx with backoff
(honouring Retry-After), their other errors mapped once (errors.py).

A client per context is made on first use and kept: kubernetes-asyncio's ApiClient holds an
aiohttp session (connections are pooled), and reading a kubeconfig with exec credentials may
run a program. Streams (port-forward) need a websocket client: one per context too.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.stream import WsApiClient

from clusterd import log
from clusterd.providers.base import ProvisionError
from clusterd.providers.kubernetes.errors import RETRIED, classify

logger = log.get("clusterd.kubernetes")

T = TypeVar("T")
# kubernetes-asyncio has no type information: its API objects are Any to mypy.
CoreApi = Any
CALL_TIMEOUT_S = 30.0
ATTEMPTS = 4
BACKOFF_S = (0.5, 1.0, 2.0)
DEFAULT_NAMESPACE = "default"


def kubeconfig_paths() -> list[str]:
    """The kubeconfig files, as kubectl finds them: KUBECONFIG (a list), else ~/.kube/config."""
    listed = os.environ.get("KUBECONFIG")
    if listed:
        return [p for p in listed.split(os.pathsep) if p]
    return [os.path.expanduser("~/.kube/config")]


@dataclasses.dataclass(frozen=True)
class Context:
    name: str
    namespace: str
    cluster: str
    user: str


def read_contexts() -> tuple[list[Context], str | None]:
    """Every context of the kubeconfig, and the current one's name. ([], None) when there is
    no kubeconfig at all; ConfigException when there is one that cannot be read."""
    paths = kubeconfig_paths()
    if not any(os.path.exists(p) for p in paths):
        return [], None
    contexts, current = config.list_kube_config_contexts(os.pathsep.join(paths))
    found = [Context(c["name"], (c.get("context") or {}).get("namespace") or DEFAULT_NAMESPACE,
                     (c.get("context") or {}).get("cluster") or "",
                     (c.get("context") or {}).get("user") or "")
             for c in contexts or []]
    return found, (current or {}).get("name")


class KubeApi:
    """Clients per context. `temp_dir` holds the certificate files kubernetes-asyncio writes
    from a kubeconfig's inline data (it must be private)."""

    def __init__(self, temp_dir: Path) -> None:
        self._temp_dir = temp_dir
        self._clients: dict[str, client.ApiClient] = {}
        self._ws_clients: dict[str, WsApiClient] = {}
        self._configs: dict[str, client.Configuration] = {}
        self._lock = anyio.Lock()

    async def _configuration(self, context: str) -> client.Configuration:
        if context not in self._configs:
            self._temp_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            configuration = client.Configuration()
            await config.load_kube_config(
                config_file=os.pathsep.join(kubeconfig_paths()), context=context,
                client_configuration=configuration, persist_config=False,
                temp_file_path=str(self._temp_dir))
            self._configs[context] = configuration
        return self._configs[context]

    async def client(self, context: str) -> client.ApiClient:
        async with self._lock:
            if context not in self._clients:
                try:
                    self._clients[context] = client.ApiClient(
                        await self._configuration(context))
                except (ConfigException, OSError, ValueError) as exc:
                    raise classify(ConfigException(str(exc)), context) from None
            return self._clients[context]

    async def ws_client(self, context: str) -> WsApiClient:
        async with self._lock:
            if context not in self._ws_clients:
                try:
                    self._ws_clients[context] = WsApiClient(
                        await self._configuration(context), heartbeat=30)
                except (ConfigException, OSError, ValueError) as exc:
                    raise classify(ConfigException(str(exc)), context) from None
            return self._ws_clients[context]

    async def core(self, context: str) -> CoreApi:
        return client.CoreV1Api(await self.client(context))

    async def call(self, context: str, what: Callable[[CoreApi], Awaitable[T]],
                   timeout_s: float = CALL_TIMEOUT_S) -> T:
        """One API call, retried on 429 and 5xx (Retry-After honoured, bounded); any other
        failure raised as the ProvisionError it is (ApiException 409 passes through as is:
        the caller decides what "already there" means)."""
        core = await self.core(context)
        for attempt in range(ATTEMPTS):
            try:
                with anyio.fail_after(timeout_s):
                    return await what(core)
            except ApiException as exc:
                if exc.status == 409:
                    raise
                if exc.status not in RETRIED or attempt == ATTEMPTS - 1:
                    raise classify(exc, context) from None
                delay = retry_after(exc) or BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                logger.info("kubernetes API busy; retrying", context=context,
                            status=exc.status, delay_s=delay)
                await anyio.sleep(delay)
            except ProvisionError:
                raise
            except Exception as exc:  # aiohttp, OSError, TimeoutError: the context's
                raise classify(exc, context) from None
        raise AssertionError("unreachable")  # the loop returns or raises

    async def aclose(self) -> None:
        for api in [*self._clients.values(), *self._ws_clients.values()]:
            await api.close()
        self._clients.clear()
        self._ws_clients.clear()
        self._configs.clear()


def retry_after(error: ApiException) -> float | None:
    """The server's Retry-After (seconds), capped at 10 s; None if it gave none."""
    headers: Any = error.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return min(10.0, max(0.0, float(value))) if value is not None else None
    except ValueError:
        return None
