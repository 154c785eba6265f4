"""The create token of a launch attempt: on disk with the intent before the provider's create
is called, handed to that create, and handed again (not a new one) to the create of a launch
resumed at the intent after the daemon died before the create answered; any other attempt gets
a fresh one (a token that was on a resource once is readable by whoever can list them)."""

from __future__ import annotations

import time

import pytest

from clusterd.providers.base import ClusterRequest, Placement
from clusterd.providers.loadtest import LoadTestHandle, LoadTestProvider
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.failover import Option
from clusterd.provision.launcher import Provisioner
from clusterd.provision.plan import LaunchPlan
from clusterd.requests import RunningRequest
from clusterd.state import ClusterStore, Database
from clusterd.state.clusters import ClusterRecord, ClusterStatus
from clusterd.state.handles import ClusterHandle
from clusterd.state.requests import RequestRecord
from clusterd.tasks.spec import ResourceRequest, Resources

pytestmark = pytest.mark.anyio

PLACE = Placement("loadtest", "mem", None, "m.test", cpus=4, memory_gb=16)


class Recording(LoadTestProvider):
    """The load test provider, noting each create's token and what the disk said of it then."""

    def __init__(self, db: Database) -> None:
        super().__init__()
        self.db = db
        self.tokens: list[tuple[str, str | None]] = []

    async def create(self, request: ClusterRequest, placement: Placement) -> LoadTestHandle:
        on_disk = ClusterStore(self.db)  # a daemon started now would read this
        await on_disk.load()
        record = on_disk.get(request.name)
        assert record is not None
        self.tokens.append((request.create_token, record.handle.create_token))
        return await super().create(request, placement)


async def launch(db: Database, handle: ClusterHandle) -> Recording:
    store = ClusterStore(db)
    await store.load()
    now = time.time()
    record = ClusterRecord("c", "loadtest", "c-0a1b2c", ClusterStatus.INIT, 1,
                           ResourceRequest(), "h", now, now, handle=handle)
    await store.insert(record, "test", None)
    provider = Recording(db)
    provisioner = Provisioner(store, ProviderRegistry([provider]), wait_timeout_s=10,
                              retry_gap_s=1, retry_max_gap_s=1)
    request = ClusterRequest("c", "c-0a1b2c", 1, Resources())
    plan = LaunchPlan("c", "c-0a1b2c", 1, False, only=Option(PLACE, request))
    running = RunningRequest(RequestRecord(1, "launch", "c", {}, "RUNNING", now))
    await provisioner.provision(running, record, plan)
    return provider


async def test_a_new_attempts_token_is_on_disk_before_its_create(db: Database) -> None:
    provider = await launch(db, ClusterHandle())
    [(token, on_disk)] = provider.tokens
    assert len(token) >= 24 and on_disk == token


async def test_a_launch_resumed_at_its_intent_hands_the_create_its_token_again(
        db: Database) -> None:
    provider = await launch(db, ClusterHandle(intent=PLACE, create_token="the-dead-daemons"))
    assert provider.tokens == [("the-dead-daemons", "the-dead-daemons")]


@pytest.mark.parametrize("handle", [
    # The create had answered: its nodes are known; what is made now is new.
    ClusterHandle(intent=PLACE, provider=LoadTestHandle(), create_token="answered"),
    # The interrupted attempt was elsewhere.
    ClusterHandle(intent=Placement("loadtest", "other", None, "m.test", 4, 16),
                  create_token="there"),
])
async def test_any_other_attempt_gets_a_fresh_token(db: Database, handle: ClusterHandle
                                                    ) -> None:
    provider = await launch(db, handle)
    [(token, on_disk)] = provider.tokens
    assert token not in ("answered", "there") and on_disk == token
