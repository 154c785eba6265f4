"""Kubeconfig credentials that expire: a real exec plugin (a small program, run the way kubectl
runs one) feeds a context's configuration; its token is replaced before it expires and when a
401 says so, never needlessly; and the API server's quota refusals are told from RBAC."""

from __future__ import annotations

import base64
import json
import stat
import sys
import time
from pathlib import Path

import anyio
import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException

from clusterd.providers.base import BlockScope
from clusterd.providers.kubernetes.credentials import ContextAuth, Credential, parse_time
from clusterd.providers.kubernetes.errors import classify

pytestmark = pytest.mark.anyio

# Prints an ExecCredential whose token counts the runs (kept in a file beside it), and what
# it was given (its argv, env and KUBERNETES_EXEC_INFO) to another.
PLUGIN = """#!{python}
import datetime, json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
count_file = os.path.join(here, "count")
n = int(open(count_file).read()) + 1 if os.path.exists(count_file) else 1
open(count_file, "w").write(str(n))
json.dump({{"argv": sys.argv[1:], "env": os.environ.get("PLUGIN_ENV"),
           "info": json.loads(os.environ["KUBERNETES_EXEC_INFO"])}},
          open(os.path.join(here, "seen"), "w"))
ttl = float(os.environ.get("PLUGIN_TTL", "3600"))
expiry = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=ttl))
status = {{"token": f"token-{{n}}"}}
if ttl > 0:
    status["expirationTimestamp"] = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({{"apiVersion": "{version}", "kind": "ExecCredential", "status": status}}))
"""


def kubeconfig(tmp: Path, exec_section: dict[str, object]) -> Path:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"exec": exec_section}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    path = tmp / "kubeconfig"
    path.write_text(json.dumps(config))
    return path


def plugin(tmp: Path, version: str = "client.authentication.k8s.io/v1") -> Path:
    path = tmp / "bin" / "get-token"
    path.parent.mkdir()
    path.write_text(PLUGIN.format(python=sys.executable, version=version))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def runs(tmp: Path) -> int:
    return int((tmp / "bin" / "count").read_text())


async def test_the_plugin_runs_as_kubectl_runs_it_and_its_token_is_used(tmp_path: Path) -> None:
    plugin(tmp_path)
    config = kubeconfig(tmp_path, {
        "apiVersion": "client.authentication.k8s.io/v1", "command": "./bin/get-token",
        "args": ["--cluster", "k"], "env": [{"name": "PLUGIN_ENV", "value": "set"}],
        "interactiveMode": "Never", "provideClusterInfo": True})
    auth = ContextAuth([str(config)], "c", str(tmp_path / "tmp"))
    configuration = await auth.load()
    assert configuration.api_key["BearerToken"] == "Bearer token-1"
    seen = json.loads((tmp_path / "bin" / "seen").read_text())
    assert seen["argv"] == ["--cluster", "k"] and seen["env"] == "set"
    assert seen["info"]["spec"]["interactive"] is False
    assert seen["info"]["spec"]["cluster"]["server"] == "https://127.0.0.1:1"
    # A token good for an hour is not asked for again before each request.
    await configuration.get_api_key_with_prefix("BearerToken")
    assert runs(tmp_path) == 1
    assert auth.kind == "exec" and auth.expires_at() is not None


async def test_a_token_near_its_expiry_is_replaced_before_the_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin(tmp_path, "client.authentication.k8s.io/v1beta1")
    monkeypatch.setenv("PLUGIN_TTL", "8")  # a margin of 2 s
    config = kubeconfig(tmp_path, {"apiVersion": "client.authentication.k8s.io/v1beta1",
                                   "command": str(tmp_path / "bin" / "get-token")})
    auth = ContextAuth([str(config)], "c", str(tmp_path / "tmp"))
    configuration = await auth.load()
    assert await configuration.get_api_key_with_prefix("BearerToken") == "Bearer token-1"
    expires = auth.expires_at()
    assert expires is not None
    # A life of 7-8 s (the expiry is in whole seconds): a margin of 1.75-2 s.
    while time.time() < expires - 2:
        assert await configuration.get_api_key_with_prefix("BearerToken") == "Bearer token-1"
        await anyio.sleep(0.5)
    await anyio.sleep(max(0.0, expires - 1.5 - time.time()))
    assert await configuration.get_api_key_with_prefix("BearerToken") == "Bearer token-2"
    assert runs(tmp_path) == 2


async def test_a_401_gets_one_refresh_for_all_who_saw_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin(tmp_path)
    monkeypatch.setenv("PLUGIN_TTL", "0")  # no expirationTimestamp: only a 401 says
    config = kubeconfig(tmp_path, {"apiVersion": "client.authentication.k8s.io/v1",
                                   "command": str(tmp_path / "bin" / "get-token"),
                                   "interactiveMode": "IfAvailable"})
    auth = ContextAuth([str(config)], "c", str(tmp_path / "tmp"))
    configuration = await auth.load()
    seen = auth.generation
    assert auth.expires_at() is None
    assert await auth.refresh(seen) and await auth.refresh(seen)  # two calls saw the 401
    assert runs(tmp_path) == 2
    assert configuration.api_key["BearerToken"] == "Bearer token-2"


async def test_plugin_failures_are_named(tmp_path: Path) -> None:
    cases = [
        ({"command": "no-such-aws-iam-authenticator", "installHint": "install it: apt ..."},
         "not found (install it: apt ...)"),
        ({"command": "/bin/sh", "args": ["-c", "echo expired >&2; exit 3"]},
         "exited with 3: expired"),
        ({"command": "/bin/echo", "args": ["{}"]}, "printed no ExecCredential"),
        ({"command": "/bin/true", "interactiveMode": "Always"}, "wants a terminal"),
    ]
    for extra, message in cases:
        config = kubeconfig(tmp_path, {"apiVersion": "client.authentication.k8s.io/v1",
                                       **extra})
        with pytest.raises(ConfigException, match=message.replace("(", r"\(").replace(
                ")", r"\)")):
            await ContextAuth([str(config)], "c", str(tmp_path / "tmp")).load()


async def test_a_plugin_that_hangs_is_given_up_on(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("clusterd.providers.kubernetes.credentials.EXEC_TIMEOUT_S", 1.0)
    config = kubeconfig(tmp_path, {"apiVersion": "client.authentication.k8s.io/v1",
                                   "command": "/bin/sleep", "args": ["30"]})
    started = time.monotonic()
    with pytest.raises(ConfigException, match="no credential within 1 s"):
        await ContextAuth([str(config)], "c", str(tmp_path / "tmp")).load()
    assert time.monotonic() - started < 10


def test_the_margin_is_a_quarter_of_the_life_at_most_a_minute() -> None:
    short = Credential(token="t", expires_at=1020.0, obtained_at=1000.0)
    assert not short.due(1014.9) and short.due(1015.0)
    eks = Credential(token="t", expires_at=1900.0, obtained_at=1000.0)
    assert not eks.due(1839.9) and eks.due(1840.0)
    assert not Credential(token="t").due(time.time() + 10**9)
    assert parse_time("1970-01-01T00:01:00Z") == 60.0
    assert parse_time("1970-01-01T01:01:00.5+01:00") == 60.5


def forbidden(message: str) -> ApiException:
    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps({"kind": "Status", "reason": "Forbidden", "message": message})
    return error


def test_quota_refusals_are_named_as_quota_not_rbac() -> None:
    limits = classify(forbidden(
        'pods "c-1-head" is forbidden: failed quota: team-quota: must specify '
        "limits.cpu,limits.memory"), "bed-b")
    assert limits.message.startswith("kubernetes/bed-b: ResourceQuota team-quota wants every "
                                     "pod to state limits.cpu,limits.memory (a quota rule")
    assert len(limits.message) <= 160  # the failover table shows 140 characters
    assert limits.hint is not None and "not a permission" in limits.hint
    assert "RBAC" not in limits.message + limits.hint
    used = classify(forbidden('pods "x" is forbidden: exceeded quota: q, requested: pods=1, '
                              "used: pods=0, limited: pods=0"), "bed-b")
    assert used.hint is not None and "used up" in used.hint
    rbac = classify(forbidden('pods is forbidden: User "u" cannot create resource "pods" in '
                              'API group "" in the namespace "n"'), "bed-b")
    assert rbac.hint is not None and "RBAC" in rbac.hint and "kubernetes-rbac.yaml" in rbac.hint
    assert {e.scope for e in (limits, used, rbac)} == {BlockScope.REGION}


def test_credentials_refused_block_only_their_context() -> None:
    error = ApiException(status=401, reason="Unauthorized")
    refused = classify(error, "bed-x")
    assert refused.scope == BlockScope.REGION and "bed-x" in refused.message



async def test_an_oidc_id_token_is_used_until_near_its_exp(tmp_path: Path) -> None:
    exp = int(time.time()) + 3600

    def b64(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    id_token = f"{b64({'alg': 'none'})}.{b64({'exp': exp, 'sub': 'u'})}.sig"
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"auth-provider": {"name": "oidc", "config": {
            "client-id": "clusterd", "id-token": id_token, "refresh-token": "r",
            "idp-issuer-url": "https://127.0.0.1:1"}}}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    auth = ContextAuth([str(path)], "c", str(tmp_path / "tmp"))
    configuration = await auth.load()
    assert auth.kind == "oidc" and auth.expires_at() == exp
    assert await configuration.get_api_key_with_prefix("BearerToken") == f"Bearer {id_token}"
