"""The Kubernetes API, per kubeconfig context: clients loaded the standard way (`KUBECONFIG`,
else `~/.kube/config`), each context's namespace, and calls retried on 429 and 5xx with backoff
(honouring Retry-After), their other errors mapped once (errors.py).

A client per context is made on first use and kept: kubernetes-asyncio's ApiClient holds an
aiohttp session (connections are pooled), and reading a kubeconfig with exec credentials may
run a program. Streams (port-forward) need a websocket client: one per context too. Both share
the context's configuration, whose credentials credentials.py keeps fresh: refreshed before
they expire, and once on a 401 (the call, or the websocket's opening, is then retried once).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import anyio
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.stream import WsApiClient

from clusterd import log
from clusterd.providers.base import ProvisionError
from clusterd.providers.kubernetes.credentials import ContextAuth
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
        self._auth: dict[str, ContextAuth] = {}
        # The certificate generation each context's clients were made with: an exec plugin
        # that gives client certificates needs new clients (TLS) when they change.
        self._made_with: dict[str, int] = {}
        self._retired: list[client.ApiClient] = []
        self._lock = anyio.Lock()

    async def _context_auth(self, context: str) -> ContextAuth:
        """The context's credentials, loaded once (under self._lock)."""
        if context not in self._auth:
            self._temp_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                auth = ContextAuth(kubeconfig_paths(), context, str(self._temp_dir))
                await auth.load()
            except (ConfigException, OSError, ValueError) as exc:
                raise classify(ConfigException(str(exc)), context) from None
            self._auth[context] = auth
        return self._auth[context]

    def _retire_stale(self, context: str, auth: ContextAuth) -> None:
        """Clients made with a client certificate since replaced: closed later (a call may
        still be using them), new ones made on demand."""
        if self._made_with.get(context, auth.cert_generation) != auth.cert_generation:
            for made in (self._clients, self._ws_clients):
                if context in made:
                    self._retired.append(made.pop(context))
        self._made_with[context] = auth.cert_generation

    async def client(self, context: str) -> client.ApiClient:
        async with self._lock:
            auth = await self._context_auth(context)
            self._retire_stale(context, auth)
            if context not in self._clients:
                assert auth.configuration is not None
                self._clients[context] = client.ApiClient(auth.configuration)
            return self._clients[context]

    async def ws_client(self, context: str) -> WsApiClient:
        async with self._lock:
            auth = await self._context_auth(context)
            self._retire_stale(context, auth)
            if context not in self._ws_clients:
                assert auth.configuration is not None
                self._ws_clients[context] = WsApiClient(auth.configuration, heartbeat=30)
            return self._ws_clients[context]

    async def core(self, context: str) -> CoreApi:
        return client.CoreV1Api(await self.client(context))

    def generation(self, context: str) -> int:
        """Which credentials a call about to start uses (to pass to `unauthorized`); its
        client (`core`, `ws_client`) has loaded them."""
        auth = self._auth.get(context)
        return auth.generation if auth is not None else 0

    async def unauthorized(self, context: str, seen: int) -> bool:
        """A call made with credentials of generation `seen` got 401: refresh them (once for
        all the calls that did). True if the call is worth retrying with new ones."""
        auth = self._auth.get(context)
        if auth is None:
            return False
        try:
            return await auth.refresh(seen)
        except (ConfigException, OSError, ValueError) as exc:
            raise classify(ConfigException(str(exc)), context) from None

    async def call(self, context: str, what: Callable[[CoreApi], Awaitable[T]],
                   timeout_s: float = CALL_TIMEOUT_S) -> T:
        """One API call, retried on 429 and 5xx (Retry-After honoured, bounded) and once on
        401 with refreshed credentials; any other failure raised as the ProvisionError it is
        (ApiException 409 passes through as is: the caller decides what "already there"
        means)."""
        refreshed = False
        attempt = 0
        while True:
            try:
                core = await self.core(context)
                seen = self.generation(context)
                with anyio.fail_after(timeout_s):
                    return await what(core)
            except ApiException as exc:
                if exc.status == 409:
                    raise
                if exc.status == 401 and not refreshed:
                    refreshed = True
                    if await self.unauthorized(context, seen):
                        logger.info("kubernetes credentials refused; retrying with new ones",
                                    context=context)
                        continue
                attempt += 1
                if exc.status not in RETRIED or attempt >= ATTEMPTS:
                    raise classify(exc, context) from None
                delay = retry_after(exc) or BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)]
                logger.info("kubernetes API busy; retrying", context=context,
                            status=exc.status, delay_s=delay)
                await anyio.sleep(delay)
            except ProvisionError:
                raise
            except ConfigException as exc:  # a refresh before the request failed
                raise classify(exc, context) from None
            except Exception as exc:  # aiohttp, OSError, TimeoutError: the context's
                raise classify(exc, context) from None

    @asynccontextmanager
    async def portforward(self, context: str, namespace: str, pod: str,
                          port: int) -> AsyncIterator[Any]:
        """A websocket to the pod's port (the `portforward` subresource), opened again once
        with refreshed credentials if the API server refuses the old ones."""
        for retry in (False, True):
            ws_api = client.CoreV1Api(await self.ws_client(context))
            seen = self.generation(context)
            # A websocket's context manager, though typed as the str a request returns.
            opening: Any = await ws_api.connect_get_namespaced_pod_portforward(
                pod, namespace, ports=port, _preload_content=False)
            try:
                ws = await opening.__aenter__()
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status == 401 and not retry and await self.unauthorized(context, seen):
                    logger.info("port-forward refused; opening it with new credentials",
                                context=context, pod=pod)
                    continue
                raise
            try:
                yield ws
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await opening.__aexit__(None, None, None)
            return

    async def aclose(self) -> None:
        for api in [*self._clients.values(), *self._ws_clients.values(), *self._retired]:
            await api.close()
        self._clients.clear()
        self._ws_clients.clear()
        self._retired.clear()
        self._auth.clear()
        self._made_with.clear()


def retry_after(error: ApiException) -> float | None:
    """The server's Retry-After (seconds), capped at 10 s; None if it gave none."""
    headers: Any = error.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return min(10.0, max(0.0, float(value))) if value is not None else None
    except ValueError:
        return None
