"""Credentials of a kubeconfig context that expire, and their refresh.

kubernetes-asyncio reads a kubeconfig's user once: an `exec` plugin's token (EKS's `aws eks
get-token`, GKE's `gke-gcloud-auth-plugin`, kubelogin) or an OIDC id-token is put into the
client's configuration and kept there, so when it expires (15 minutes on EKS) every call gets
401 until the daemon restarts. Here each context's user is a source of credentials that knows
when they expire: a token is refreshed before it does (a margin of a quarter of its life, at
most a minute) and once when the API server refuses it (401: revoked early, or a plugin that
gives no expiry). kubernetes-asyncio asks for the token before every request
(Configuration.refresh_api_key_hook), websockets included, so a refresh reaches API calls and
port-forwards alike. Static tokens and certificates are the library's, unchanged.

Exec plugins are run as kubectl runs them (client.authentication.k8s.io v1 and v1beta1: args,
env, KUBERNETES_EXEC_INFO, the cluster's info when provideClusterInfo), but never
interactively (the daemon has no terminal) and within a timeout.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import os
import subprocess
import time
from typing import Any

import anyio
from kubernetes_asyncio import client
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.config.kube_config import FileOrData, KubeConfigLoader, KubeConfigMerger

from clusterd import log

logger = log.get("clusterd.kubernetes.credentials")

EXEC_TIMEOUT_S = 60.0  # `aws eks get-token` and gcloud may take a while on a cold start
MAX_MARGIN_S = 60.0
EXEC_API_VERSIONS = frozenset({"client.authentication.k8s.io/v1",
                               "client.authentication.k8s.io/v1beta1",
                               "client.authentication.k8s.io/v1alpha1"})
OUTPUT_LIMIT = 400


@dataclasses.dataclass(frozen=True)
class Credential:
    """What a plugin gave: a token, or a client certificate and key (PEM); and when it
    expires (epoch seconds; None: the plugin did not say)."""
    token: str | None = None
    cert_pem: str | None = None
    key_pem: str | None = None
    expires_at: float | None = None
    obtained_at: float = 0.0

    def due(self, now: float) -> bool:
        """Whether to get a new one now: within the margin of its expiry."""
        if self.expires_at is None:
            return False
        life = max(0.0, self.expires_at - self.obtained_at)
        return now >= self.expires_at - min(MAX_MARGIN_S, life / 4)


def parse_time(text: str) -> float:
    """RFC 3339 (`2026-12-06T03:04:05Z`, fractions and offsets too) → epoch seconds."""
    value = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    return value.timestamp()


class ExecPlugin:
    """One kubeconfig user's `exec` section."""

    def __init__(self, spec: dict[str, Any], cluster: dict[str, Any] | None,
                 base_dir: str | None, timeout_s: float | None = None) -> None:
        self.api_version = str(spec.get("apiVersion") or "")
        if self.api_version not in EXEC_API_VERSIONS:
            raise ConfigException(f"exec: apiVersion {self.api_version!r} is not one of "
                                  f"{', '.join(sorted(EXEC_API_VERSIONS))}")
        command = str(spec.get("command") or "")
        if not command:
            raise ConfigException("exec: no command")
        if os.sep in command and not os.path.isabs(command) and base_dir:
            command = os.path.join(base_dir, command)  # as kubectl: relative to the file
        self.argv = [command, *[str(a) for a in spec.get("args") or []]]
        self.env = {str(e["name"]): str(e["value"]) for e in spec.get("env") or []}
        self.interactive = str(spec.get("interactiveMode") or "IfAvailable")
        self.install_hint = str(spec.get("installHint") or "").strip()
        self.cluster = cluster if spec.get("provideClusterInfo") else None
        self.timeout_s = timeout_s if timeout_s is not None else EXEC_TIMEOUT_S

    def exec_info(self) -> dict[str, Any]:
        """KUBERNETES_EXEC_INFO: never interactive; the cluster if the plugin asks for it."""
        spec: dict[str, Any] = {"interactive": False}
        if self.cluster is not None:
            keys = {"server": "server", "tls-server-name": "tls-server-name",
                    "insecure-skip-tls-verify": "insecure-skip-tls-verify",
                    "certificate-authority-data": "certificate-authority-data",
                    "proxy-url": "proxy-url"}
            spec["cluster"] = {out: self.cluster[key] for key, out in keys.items()
                               if key in self.cluster}
            extension = next((e.get("extension") for e in self.cluster.get("extensions") or []
                              if e.get("name") == "client.authentication.k8s.io/exec"), None)
            if extension is not None:
                spec["cluster"]["config"] = extension
        return {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec}

    async def run(self) -> Credential:
        if self.interactive == "Always":
            raise ConfigException(
                f"exec: {self.argv[0]} wants a terminal (interactiveMode: Always), and "
                "clusterd runs without one; log in with it yourself first, or use a "
                "plugin mode that needs no input")
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(self.exec_info())}
        try:
            with anyio.fail_after(self.timeout_s):
                done = await anyio.run_process(self.argv, env=env, check=False,
                                               stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise ConfigException(
                f"exec: {self.argv[0]} not found"
                + (f" ({self.install_hint})" if self.install_hint else "")) from None
        except TimeoutError:
            raise ConfigException(f"exec: {self.argv[0]} gave no credential within "
                                  f"{self.timeout_s:.0f} s") from None
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip()[-OUTPUT_LIMIT:]
            raise ConfigException(f"exec: {self.argv[0]} exited with {done.returncode}"
                                  + (f": {why}" if why else ""))
        return self.parse(done.stdout)

    def parse(self, output: bytes) -> Credential:
        try:
            data = json.loads(output)
            status = data["status"]
        except (ValueError, KeyError, TypeError):
            raise ConfigException(f"exec: {self.argv[0]} printed no ExecCredential with a "
                                  "status") from None
        if data.get("apiVersion") != self.api_version:
            raise ConfigException(f"exec: {self.argv[0]} answered in {data.get('apiVersion')}"
                                  f", asked for {self.api_version}")
        expiry = status.get("expirationTimestamp")
        try:
            expires_at = parse_time(str(expiry)) if expiry else None
        except ValueError:
            raise ConfigException(f"exec: expirationTimestamp {expiry!r} is no RFC 3339 "
                                  "time") from None
        now = time.time()
        if status.get("token"):
            return Credential(token=str(status["token"]), expires_at=expires_at,
                              obtained_at=now)
        if status.get("clientCertificateData") and status.get("clientKeyData"):
            return Credential(cert_pem=str(status["clientCertificateData"]),
                              key_pem=str(status["clientKeyData"]), expires_at=expires_at,
                              obtained_at=now)
        raise ConfigException(f"exec: {self.argv[0]} gave neither a token nor a client "
                              "certificate and key")


def jwt_expiry(token: str) -> float | None:
    """The `exp` of a JWT (an OIDC id-token), unverified: only to know when to refresh."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None


class _Loader(KubeConfigLoader):
    """kubernetes-asyncio's loader, whose exec plugins are ours (a timeout, never
    interactive, the expiry kept)."""

    credential: Credential | None = None
    plugin: ExecPlugin | None = None
    cert_file: str | None
    key_file: str | None

    async def load_from_exec_plugin(self) -> bool:
        user = self._user
        assert user is not None  # the library calls this for a user with `exec`
        cluster = self._cluster.value if self._cluster is not None else None
        path = getattr(user, "path", None)
        self.plugin = ExecPlugin(dict(user["exec"].value), cluster,
                                 os.path.dirname(path) if path else None)
        await self.use(await self.plugin.run())
        return True

    async def use(self, credential: Credential) -> None:
        self.credential = credential
        if credential.token is not None:
            self.token = f"Bearer {credential.token}"
            return
        # As the library does: certificates to (private, temporary) files for ssl.
        status = {"cert": credential.cert_pem, "key": credential.key_pem}
        self.cert_file = FileOrData(status, None, data_key_name="cert",
                                    base64_file_content=False,
                                    temp_file_path=self._temp_file_path).as_file()
        self.key_file = FileOrData(status, None, data_key_name="key",
                                   base64_file_content=False,
                                   temp_file_path=self._temp_file_path).as_file()


class ContextAuth:
    """The credentials of one context, kept fresh in the configuration its clients share.
    `generation` counts the credentials given out; a change of client certificate needs
    new clients (`needs_new_clients`), a token does not (it is read per request)."""

    def __init__(self, paths: list[str], context: str, temp_dir: str) -> None:
        self.context = context
        self._loader = _Loader(config_dict=KubeConfigMerger(os.pathsep.join(paths)).config,
                               config_base_path=None, active_context=context,
                               temp_file_path=temp_dir)
        self._lock = anyio.Lock()
        self.generation = 0
        self.configuration: client.Configuration | None = None
        self.cert_generation = 0

    @property
    def kind(self) -> str:
        """"exec", "oidc" or "static" (tokens, certificates, basic auth: never refreshed)."""
        if self._loader.provider == "oidc":
            return "oidc"
        user = self._loader._user
        return "exec" if user is not None and "exec" in user else "static"

    async def load(self) -> client.Configuration:
        configuration = client.Configuration()
        await self._loader.load_and_set(configuration)
        self.configuration = configuration
        self.generation += 1
        if self.kind != "static":
            configuration.refresh_api_key_hook = self._before_request
        return configuration

    def expires_at(self) -> float | None:
        if self.kind == "exec":
            credential = self._loader.credential
            return credential.expires_at if credential is not None else None
        if self.kind == "oidc":
            return jwt_expiry(str(getattr(self._loader, "token", "")).removeprefix("Bearer "))
        return None

    def _due(self) -> bool:
        if self.kind == "exec":
            credential = self._loader.credential
            return credential is None or credential.due(time.time())
        expires = self.expires_at()
        return expires is not None and time.time() >= expires - MAX_MARGIN_S

    async def _before_request(self, configuration: client.Configuration) -> None:
        """Called by kubernetes-asyncio before each request: a token about to expire is
        replaced first."""
        if self._due():
            await self.refresh(self.generation)

    async def refresh(self, seen: int) -> bool:
        """New credentials, unless someone got newer ones than generation `seen` meanwhile
        (then those are used). False when this context's credentials cannot be refreshed
        (static ones)."""
        if self.kind == "static":
            return False
        async with self._lock:
            if self.generation != seen:
                return True
            if self.kind == "exec":
                plugin = self._loader.plugin
                assert plugin is not None  # load ran it
                credential = await plugin.run()
                await self._loader.use(credential)
                if credential.token is None:
                    self.cert_generation += 1
                when = (datetime.datetime.fromtimestamp(credential.expires_at, datetime.UTC)
                        .isoformat(timespec="seconds") if credential.expires_at else "unknown")
                logger.info("kubernetes credentials refreshed", context=self.context,
                            via=plugin.argv[0], expires=when)
            else:
                user = self._loader._user
                assert user is not None  # an oidc auth-provider is a user's
                provider = user["auth-provider"]
                await self._loader._refresh_oidc(provider)
                self._loader.token = f"Bearer {provider['config']['id-token']}"
                logger.info("kubernetes OIDC token refreshed", context=self.context)
            self.generation += 1
            assert self.configuration is not None
            if self._loader.credential is None or self._loader.credential.token is not None:
                self.configuration.api_key["BearerToken"] = self._loader.token
            else:
                self.configuration.cert_file = self._loader.cert_file
                self.configuration.key_file = self._loader.key_file
            return True
