"""EC2 and STS through aiobotocore: one client per region, made on first use, closed with the
daemon; every call's errors translated (errors.classify) before anyone else sees them.

Credentials, regions and endpoints are found the standard way botocore reads them (the AWS_*
environment, ~/.aws/credentials and config, AWS_PROFILE, AWS_ENDPOINT_URL_EC2 ...): nothing
here knows which EC2 it talks to. 5xx answers are retried by botocore's "standard" retry
mode with backoff; throttling is ridden out for minutes (throttle.py), not botocore's few
seconds; a call that hangs ends at the configured timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from clusterctl.protocol import clipped
from clusterd import log
from clusterd.providers.aws.errors import classify, error_code
from clusterd.providers.aws.images import IMAGE_NAMES, ImageKind
from clusterd.providers.aws.throttle import (
    DEFAULT_BACKOFF,
    THROTTLING_CODES,
    Backoff,
    Throttled,
    retry_throttled,
)
from clusterd.providers.base import BlockScope, ProvisionError

logger = log.get("clusterd.aws")

RETRY_ATTEMPTS = 4
CONNECT_TIMEOUT_S = 10.0

Instance = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class CredentialsLifetime:
    """Temporary credentials: where botocore found them, and when they expire (if known)."""

    method: str  # botocore's name for the provider: "assume-role", "sso", "env", ...
    expires_at: datetime.datetime | None


@dataclasses.dataclass(frozen=True)
class ObjectStoreAccess:
    """What bucket storage needs of the AWS provider, from the same session as its EC2 calls
    (credentials, region, endpoints): storage asks for this, never for the provider's API."""

    s3_client: Callable[[str], Awaitable[Any]]  # an S3 client for a region
    default_region: Callable[[], Awaitable[str]]
    # (access key, secret key, session token or None) as resolved now, or None.
    credentials: Callable[[], Awaitable[tuple[str, str, str | None] | None]]
    lifetime: Callable[[], Awaitable[CredentialsLifetime | None]]


class EC2Api:
    def __init__(self, timeout_s: Callable[[], float], backoff: Backoff = DEFAULT_BACKOFF, *,
                 sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
                 rng: random.Random | None = None,
                 tell: Callable[[str, str], Awaitable[None]] | None = None) -> None:
        self._timeout_s = timeout_s
        self._tell = tell  # (line, phase) for the user of the request being served
        self._backoff = backoff
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._session: Any = None
        self._clients: dict[tuple[str, str], Any] = {}
        self._stack = contextlib.AsyncExitStack()
        self._making = anyio.Lock()
        self._zone_names: dict[str, dict[str, str]] = {}
        self._images: dict[tuple[str, ImageKind, str], str] = {}
        # Calls made, by (operation, region): benchmarks and tests count them.
        self.calls: dict[tuple[str, str], int] = {}

    async def _get_session(self) -> Any:
        if self._session is None:
            # Importing aiobotocore takes a quarter of a second: not on the event loop.
            session = await anyio.to_thread.run_sync(_new_session)
            if self._session is None:
                self._session = session
        return self._session

    async def credentials_configured(self) -> bool:
        """Whether botocore finds credentials at all (no network unless the chain reaches an
        instance-metadata lookup, which is bounded)."""
        session = await self._get_session()
        with anyio.move_on_after(5):
            return await session.get_credentials() is not None
        return False

    async def frozen_credentials(self) -> tuple[str, str, str | None] | None:
        """(access key, secret key, session token) as botocore resolves them now, or None."""
        session = await self._get_session()
        with anyio.move_on_after(10):
            found = await session.get_credentials()
            if found is None:
                return None
            frozen = await found.get_frozen_credentials()
            return str(frozen.access_key), str(frozen.secret_key), frozen.token or None
        return None

    async def credentials_lifetime(self) -> CredentialsLifetime | None:
        """How long the credentials botocore resolves now stay valid: None for long-lived
        keys; for temporary ones (a session token: an assumed role, SSO, exported with
        AWS_CREDENTIAL_EXPIRATION) where they come from and, if botocore knows it, when they
        expire (botocore refreshes them in the daemon; a copy sent elsewhere does not)."""
        session = await self._get_session()
        with anyio.move_on_after(10):
            found = await session.get_credentials()
            if found is None:
                return None
            frozen = await found.get_frozen_credentials()  # a deferred one resolves now
            if not frozen.token:
                return None
            expiry = getattr(found, "_expiry_time", None)  # RefreshableCredentials only
            return CredentialsLifetime(str(getattr(found, "method", "") or "unknown"),
                                       expiry if isinstance(expiry, datetime.datetime)
                                       else None)
        return None

    async def default_region(self) -> str:
        """The region the user's AWS configuration names (AWS_REGION, the profile's region),
        else us-east-1."""
        session = await self._get_session()
        return str(session.get_config_variable("region") or "us-east-1")

    def object_store(self) -> ObjectStoreAccess:
        """S3 through this session (see ObjectStoreAccess)."""

        async def s3_client(region: str) -> Any:
            return await self.client("s3", region)

        return ObjectStoreAccess(s3_client, self.default_region, self.frozen_credentials,
                                 self.credentials_lifetime)

    async def client(self, service: str, region: str) -> Any:
        key = (service, region)
        found = self._clients.get(key)
        if found is not None:
            return found
        async with self._making:
            found = self._clients.get(key)
            if found is None:
                from aiobotocore.config import AioConfig

                config = AioConfig(
                    connect_timeout=CONNECT_TIMEOUT_S,
                    read_timeout=self._timeout_s(),
                    retries={"mode": "standard", "max_attempts": RETRY_ATTEMPTS},
                    max_pool_connections=20,
                )
                maker = (await self._get_session()).create_client(service, region_name=region,
                                                                  config=config)
                found = await self._stack.enter_async_context(maker)
                _no_retries_for_capacity(found)
                self._clients[key] = found
        return found

    async def call(self, region: str, operation: str, service: str = "ec2",
                   **params: Any) -> dict[str, Any]:
        """One API call; raises ProvisionError (classified) on any failure."""
        started = time.monotonic()

        async def once() -> dict[str, Any]:
            self.calls[(operation, region)] = self.calls.get((operation, region), 0) + 1
            client = await self.client(service, region)
            answer: dict[str, Any] = await getattr(client, _snake(operation))(**params)
            return answer

        try:
            result = await retry_throttled(
                once, lambda exc: error_code(exc) in THROTTLING_CODES,
                f"{operation} in {region}", self._backoff, rng=self._rng, sleep=self._sleep,
                tell=self._tell_throttled)
        except Throttled as exc:
            first = classify(exc.error, f"aws/{region}")
            error = ProvisionError(f"{first.message} (still throttled after {exc.tries} "
                                   f"tries over {exc.waited_s:.0f} s)", first.scope, first.hint)
            logger.info("aws call failed", operation=operation, region=region,
                        error=clipped(error.message, 200),
                        seconds=round(time.monotonic() - started, 2))
            raise error from None
        except Exception as exc:
            error = classify(exc, f"aws/{region}")
            logger.info("aws call failed", operation=operation, region=region,
                        error=clipped(error.message, 200),
                        seconds=round(time.monotonic() - started, 2))
            raise error from None
        return result

    async def _tell_throttled(self, text: str) -> None:
        if self._tell is not None:
            await self._tell(text, "throttled")

    async def pages(self, region: str, operation: str, key: str,
                    **params: Any) -> list[dict[str, Any]]:
        """Every item under `key` of a paginated call."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = await self.call(region, operation, **params,
                                   **({"NextToken": token} if token else {}))
            items.extend(page.get(key, []))
            token = page.get("NextToken")
            if not token:
                return items

    async def aclose(self) -> None:
        await self._stack.aclose()
        self._clients.clear()

    # -- lookups, cached where they never change -------------------------------------------

    async def instances(self, region: str, filters: list[dict[str, Any]]) -> list[Instance]:
        reservations = await self.pages(region, "DescribeInstances", "Reservations",
                                        Filters=filters, MaxResults=1000)
        return [i for r in reservations for i in r.get("Instances", [])]

    async def zone_names(self, region: str) -> dict[str, str]:
        """Zone ID → zone name (the catalog speaks IDs; the API takes names, which differ
        from account to account)."""
        cached = self._zone_names.get(region)
        if cached is None:
            answer = await self.call(region, "DescribeAvailabilityZones",
                                     Filters=[{"Name": "zone-type",
                                               "Values": ["availability-zone"]}])
            cached = {z["ZoneId"]: z["ZoneName"] for z in answer["AvailabilityZones"]
                      if z.get("State", "available") == "available"}
            self._zone_names[region] = cached
        return cached

    async def default_image(self, region: str, kind: ImageKind = ImageKind.UBUNTU,
                            arch: str = "amd64") -> str:
        """The newest image of `kind` (images.py) its publisher has in the region."""
        cached = self._images.get((region, kind, arch))
        if cached is None:
            name = IMAGE_NAMES[kind]
            pattern = name.pattern(arch)
            if pattern is None:
                raise ProvisionError(f"aws/{region}: {name.what} is not published for {arch}",
                                     BlockScope.FATAL, "name an image with resources.image_id")
            images = (await self.call(
                region, "DescribeImages", Owners=[name.owner],
                Filters=[{"Name": "name", "Values": [pattern]},
                         {"Name": "state", "Values": ["available"]}],
            )).get("Images", [])
            if not images:
                raise ProvisionError(f"aws/{region}: no image of {name.what} found (owner "
                                     f"{name.owner}, name {pattern!r})", BlockScope.REGION,
                                     "name an image with resources.image_id")
            newest = max(images, key=lambda i: (i.get("CreationDate") or "", i["Name"]))
            cached = newest["ImageId"]
            self._images[(region, kind, arch)] = cached
        return cached


# Capacity is gone for minutes, not milliseconds: retrying it in place only delays trying the
# next zone. (botocore's standard mode retries every 5xx, and EC2 answers these with 500.)
NOT_TRANSIENT = frozenset({"InsufficientInstanceCapacity", "InsufficientHostCapacity",
                           "InsufficientReservedInstanceCapacity", "InsufficientCapacity"})


def _no_retries_for_capacity(client: Any) -> None:
    """Wrap the client's retry handler (botocore's standard mode, as configured) so that it
    leaves capacity errors alone, and throttling to EC2Api.call's longer patience (throttle.py);
    everything else (other 5xx, timeouts) it retries with backoff as before."""
    from aiobotocore.retries import standard

    name = client.meta.service_model.service_id.hyphenize()
    event, unique = f"needs-retry.{name}", f"retry-config-{name}"
    client.meta.events.unregister(event, unique_id=unique)
    handler = standard.register_retry_handler(client, RETRY_ATTEMPTS)
    client.meta.events.unregister(event, unique_id=unique)

    async def needs_retry(**kwargs: Any) -> Any:
        response = kwargs.get("response")
        parsed = response[1] if response is not None and len(response) > 1 else None
        if isinstance(parsed, dict) and parsed.get("Error", {}).get("Code") in (
                NOT_TRANSIENT | THROTTLING_CODES):
            return None
        return await handler.needs_retry(**kwargs)

    client.meta.events.register(event, needs_retry, unique_id=unique)


def _new_session() -> Any:
    from aiobotocore.session import get_session

    session = get_session()
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() != "false":
        # This runs on a workstation: never ask 169.254.169.254 for credentials (a packet to
        # a non-loopback address, and seconds of timeouts) unless told to.
        session.get_component("credential_provider").remove("iam-role")
    return session


def tag_value(resource: dict[str, Any], key: str) -> str | None:
    """The value of a resource's tag (an instance's, a security group's), if it has it."""
    for tag in resource.get("Tags", []):
        if tag.get("Key") == key:
            return str(tag.get("Value"))
    return None


def _snake(operation: str) -> str:
    out = []
    for index, char in enumerate(operation):
        if char.isupper() and index:
            out.append("_")
        out.append(char.lower())
    return "".join(out)
