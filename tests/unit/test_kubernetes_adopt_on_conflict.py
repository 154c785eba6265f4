"""What a create that finds a name taken (409) adopts: only what this create attempt made (its
token on it: a create retried, or resumed after the daemon died) or what the cluster already
had (a repair); a pod someone planted under the name with our labels copied is refused, named,
and left untouched. The API here is an in-memory one behind the provider's own KubeApi.call
(its 409 and error handling are the real ones); the bed's API server is in
tests/e2e/test_kubernetes_adoption.py."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from clusterd.providers.base import BlockScope, ProvisionError
from clusterd.providers.kubernetes import pods
from clusterd.providers.kubernetes.api import KubeApi
from clusterd.providers.kubernetes.manifests import (
    ANNOTATION_CREATE_TOKEN,
    PodSpec,
    pod_manifest,
    ssh_service_manifest,
)

NAMESPACE = "bed-a"
SPEC = PodSpec("c-1a2b3c", "c", "clusterd-0123456789ab", "node:1", "Never", "ssh-ed25519 K",
               0.5, 1.0, create_token="this-attempts-token")


class Objects:
    """The API server's pods and Services of one namespace, and every call made to it."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], Any] = {}
        self.calls: list[tuple[str, str, str]] = []

    def plant(self, kind: str, manifest: dict[str, Any]) -> str:
        """An object as someone's create leaves it (the server gives it a uid)."""
        meta = manifest["metadata"]
        uid = str(uuid.uuid4())
        metadata = client.V1ObjectMeta(name=meta["name"], labels=dict(meta["labels"]),
                                       annotations=dict(meta.get("annotations") or {}),
                                       uid=uid)
        if kind == "pod":
            found = client.V1Pod(metadata=metadata, spec=client.V1PodSpec(containers=[]),
                                 status=client.V1PodStatus(phase="Running", conditions=[]))
        else:
            found = client.V1Service(metadata=metadata, spec=client.V1ServiceSpec(
                selector=dict(manifest["spec"]["selector"])))
        self.items[(kind, meta["name"])] = found
        return uid

    def _create(self, kind: str, manifest: dict[str, Any]) -> Any:
        name = manifest["metadata"]["name"]
        self.calls.append(("create", kind, name))
        if (kind, name) in self.items:
            raise ApiException(status=409, reason="AlreadyExists")
        self.plant(kind, manifest)

    def _read(self, kind: str, name: str) -> Any:
        self.calls.append(("read", kind, name))
        if (kind, name) not in self.items:
            raise ApiException(status=404, reason="NotFound")
        return self.items[(kind, name)]

    async def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> Any:
        return self._create("pod", body)

    async def create_namespaced_service(self, namespace: str, body: dict[str, Any]) -> Any:
        return self._create("service", body)

    async def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        return self._read("pod", name)

    async def read_namespaced_service(self, name: str, namespace: str) -> Any:
        return self._read("service", name)

    async def delete_namespaced_pod(self, name: str, namespace: str, **_: Any) -> Any:
        self.calls.append(("delete", "pod", name))
        self.items.pop(("pod", name), None)


class InMemoryApi(KubeApi):
    def __init__(self, objects: Objects, tmp: Path) -> None:
        super().__init__(tmp)
        self.objects = objects

    async def core(self, context: str) -> Any:
        return self.objects


def create(objects: Objects, tmp: Path, spec: PodSpec = SPEC, nodeport: bool = False,
           known: frozenset[str] = frozenset()) -> None:
    api = InMemoryApi(objects, tmp)
    anyio.run(lambda: pods.create(api, "bed-a", NAMESPACE, spec, 1, nodeport, [], known))


def planted_head(token: str | None) -> dict[str, Any]:
    """Our head pod's manifest as someone else would make it: our labels, their token."""
    manifest = copy.deepcopy(pod_manifest(SPEC, 0))
    if token is None:
        del manifest["metadata"]["annotations"]
    else:
        manifest["metadata"]["annotations"][ANNOTATION_CREATE_TOKEN] = token
    return manifest


@pytest.mark.parametrize("token", [None, "", "an-earlier-attempts-token"])
def test_a_pod_planted_with_our_labels_is_refused_and_left_alone(tmp_path: Path,
                                                                token: str | None) -> None:
    """No token, an empty one, or one copied from another pod of ours: not this create's."""
    objects = Objects()
    objects.plant("pod", planted_head(token))
    with pytest.raises(ProvisionError) as raised:
        create(objects, tmp_path)
    error = raised.value
    assert error.scope == BlockScope.FATAL
    assert "refusing the pod c-1a2b3c-head in namespace bed-a" in error.message
    assert "not made by this launch" in error.message
    assert "kubectl -n bed-a get pod c-1a2b3c-head" in (error.hint or "")
    # Looked at, nothing more: not deleted, not replaced.
    assert objects.calls == [("create", "pod", "c-1a2b3c-head"), ("read", "pod", "c-1a2b3c-head")]


def test_a_pod_this_create_made_is_adopted(tmp_path: Path) -> None:
    """A create resumed after the daemon died meets its own pod: the token recorded before the
    create is on it."""
    objects = Objects()
    uid = objects.plant("pod", pod_manifest(SPEC, 0))
    create(objects, tmp_path)
    assert objects.items[("pod", "c-1a2b3c-head")].metadata.uid == uid
    assert ("delete", "pod", "c-1a2b3c-head") not in objects.calls


def test_a_pod_the_cluster_already_had_is_adopted_in_a_repair(tmp_path: Path) -> None:
    """A repair is a new attempt (a new token); the pods that survived carry the old one and
    are known by their uid, which the API server gave them."""
    objects = Objects()
    uid = objects.plant("pod", planted_head("the-launchs-token"))
    create(objects, tmp_path, known=frozenset({uid}))
    assert objects.items[("pod", "c-1a2b3c-head")].metadata.uid == uid
    with pytest.raises(ProvisionError, match="not made by this launch"):
        create(objects, tmp_path, known=frozenset({"another-pods-uid"}))


def test_a_service_is_adopted_only_if_it_selects_what_ours_would(tmp_path: Path) -> None:
    objects = Objects()
    objects.plant("pod", pod_manifest(SPEC, 0))
    ours = copy.deepcopy(ssh_service_manifest(SPEC, "c-1a2b3c-head"))
    ours["metadata"]["annotations"][ANNOTATION_CREATE_TOKEN] = "the-launchs-token"
    objects.plant("service", ours)
    create(objects, tmp_path, nodeport=True)  # a repair's: same selector, another token
    elsewhere = copy.deepcopy(ours)
    elsewhere["spec"]["selector"] = {"app": "theirs"}
    objects.plant("service", elsewhere)
    with pytest.raises(ProvisionError) as raised:
        create(objects, tmp_path, nodeport=True)
    assert "refusing the service c-1a2b3c-head-ssh in namespace bed-a" in raised.value.message
    assert "{'app': 'theirs'}" in raised.value.message
