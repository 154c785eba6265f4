"""Kubernetes API errors → what they rule out. The one place kubernetes-asyncio's and aiohttp's
exceptions are understood.

A kubeconfig context is the provider's "region" (failover goes from one to the next), and there
are no zones. So what one context refuses blocks that context: RBAC (403 Forbidden), a
ResourceQuota (a 403 too, told apart by its message: used up, or one that wants every pod to
state a limit the pod lacks), a scheduler that cannot place the pods, an API server that does
not answer, and credentials refused (401, after one refresh in api.py: each context has a user
of its own). A spec the API server rejects (422) is fatal: no other context accepts it. 429 and
5xx are retried with backoff before they get here (api.py), and what still fails is the
context's. 409 on a create means the object is there: the caller adopts it, it is no error.
"""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException

from clusterd.providers.base import BlockScope, ProvisionError

MESSAGE_LIMIT = 400
RETRIED = frozenset({429, 500, 502, 503, 504})


def status_message(error: ApiException) -> str:
    """The Status body's reason and message (`Forbidden: pods "x" is forbidden: ...`), or the
    HTTP reason when the body is not a Status."""
    try:
        body: dict[str, Any] = json.loads(error.body or "{}")
    except (ValueError, TypeError):
        body = {}
    message = str(body.get("message") or "").strip()
    reason = str(body.get("reason") or error.reason or "").strip()
    text = f"{reason}: {message}" if message else reason or f"HTTP {error.status}"
    return text[:MESSAGE_LIMIT]


# The quota admission plugin's two refusals (k8s.io/apiserver's resourcequota controller):
# "exceeded quota: NAME, requested: ..., used: ..., limited: ..." and, where a quota limits a
# resource the pod does not state, "failed quota: NAME: must specify limits.cpu,...".
_MUST_SPECIFY = re.compile(r"failed quota: (?P<quota>[^:]+): must specify (?P<what>[^\s\"]+)")


def exceeded_quota(error: ApiException) -> bool:
    return error.status == 403 and "exceeded quota" in (status_message(error) or "")


def quota_wants(error: ApiException) -> tuple[str, str] | None:
    """(quota, what it wants stated) when a ResourceQuota refused a pod for lacking a request
    or limit it constrains (`must specify limits.cpu`); None otherwise."""
    if error.status != 403:
        return None
    found = _MUST_SPECIFY.search(status_message(error))
    return (found["quota"].strip(), found["what"].rstrip(",.")) if found else None


def classify(error: BaseException, context: str) -> ProvisionError:
    """A ProvisionError saying what `error` rules out, its message naming the context."""
    if isinstance(error, ProvisionError):
        return error
    where = f"kubernetes/{context}"
    if isinstance(error, ApiException):
        text = f"{where}: {status_message(error)}"
        if error.status == 401:
            return ProvisionError(text, BlockScope.REGION,
                                  "the context's credentials were refused even after a "
                                  "refresh: log in again (or check the kubeconfig's user); "
                                  "`clusterctl check` shows what clusterd sees")
        if exceeded_quota(error):
            return ProvisionError(text, BlockScope.REGION,
                                  "the namespace's ResourceQuota is used up: free some of it, "
                                  "or let clusterd use another context")
        wants = quota_wants(error)
        if wants is not None:
            quota, what = wants
            # Short: the failover table shows the first 140 characters, not the hint.
            return ProvisionError(
                f"{where}: ResourceQuota {quota} wants every pod to state {what} (a quota "
                "rule, not a permission; a LimitRange default fills it in)",
                BlockScope.REGION,
                "this is a quota rule, not a permission: give the namespace a LimitRange "
                "whose default (limits) or defaultRequest (requests) fills it in, drop it "
                "from the quota, or let clusterd use another context")
        if error.status == 403:
            return ProvisionError(text, BlockScope.REGION,
                                  "this context's user may not do this (RBAC): grant it (the "
                                  "Role clusterd needs is docs/kubernetes-rbac.yaml), or drop "
                                  "the context from kubernetes.allowed_contexts")
        if error.status == 422 or error.status == 400:
            return ProvisionError(text, BlockScope.FATAL)
        if error.status == 404:
            return ProvisionError(text, BlockScope.REGION,
                                  "the context's namespace may not exist")
        # 429 here: still limited after api.py's retries (API Priority and Fairness).
        return ProvisionError(text, BlockScope.REGION, throttled=error.status == 429)
    if isinstance(error, ConfigException):
        return ProvisionError(f"{where}: the kubeconfig cannot be used: {error}",
                              BlockScope.REGION, "check KUBECONFIG or ~/.kube/config")
    if isinstance(error, aiohttp.ClientError | OSError | TimeoutError):
        why = str(error) or type(error).__name__
        return ProvisionError(f"{where}: the API server does not answer ({why})",
                              BlockScope.REGION, "check that the cluster is up and reachable")
    return ProvisionError(f"{where}: {type(error).__name__}: {error}"[:MESSAGE_LIMIT],
                          BlockScope.FATAL)
