"""The instance metadata service, as EC2 serves it to its instances: http://169.254.169.254 in
the bed's namespace, which every node reaches through its VPC's gateway (node_init routes it).

IMDSv2 only, as clusterd launches instances (HttpTokens=required): a PUT to /latest/api/token
gives a token for a TTL; every GET must carry one, from the address it was given to, or gets
401. The instance is the one whose private address the request comes from (each node has its
own network namespace, so that address is whose it is). Its instance profile is what EC2 says
is associated with it now, and its credentials are the profile's role's, from STS's
AssumeRole in moto: temporary keys with an expiry, renewed before it, as EC2 hands them out.
botocore and rclone on a node find them as on EC2, with no credentials file.

Served paths: meta-data/instance-id, placement/region, placement/availability-zone,
local-ipv4, iam/info, iam/security-credentials/[ROLE], and
dynamic/instance-identity/document. Standard library plus boto3 (to moto); run by the
controller, as a thread.
"""

from __future__ import annotations

import datetime
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("testbed.ec2.imds")

IMDS_IP, IMDS_PORT = "169.254.169.254", 80
TOKEN_TTL_MAX_S = 21600
CREDENTIALS_S = 3600  # the role's session, as EC2's are (renewed 5 minutes before the end)
RENEW_BEFORE_S = 300


class Instance:
    def __init__(self, instance_id: str, region: str, zone: str, ip: str,
                 profile_arn: str | None) -> None:
        self.id, self.region, self.zone, self.ip = instance_id, region, zone, ip
        self.profile_arn = profile_arn


class Metadata:
    """What the handler answers from. `find(ip)` gives the running instance with that private
    address, or None; `iam()` a boto3 client to moto; `assume(role ARN, session name,
    seconds)` a role's temporary credentials as STS's AssumeRole gives them."""

    def __init__(self, find: Callable[[str], Instance | None], iam: Callable[[], Any],
                 assume: Callable[[str, str, int], dict[str, Any]]) -> None:
        self.find, self.iam, self.assume = find, iam, assume
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[str, float]] = {}  # token -> (address, expiry)
        self._credentials: dict[tuple[str, str], dict[str, str]] = {}  # (id, role) -> creds
        self.requests = 0

    def new_token(self, ip: str, ttl: int) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            now = time.monotonic()
            self._tokens = {t: v for t, v in self._tokens.items() if v[1] > now}
            self._tokens[token] = (ip, now + ttl)
        return token

    def token_ok(self, token: str | None, ip: str) -> bool:
        with self._lock:
            found = self._tokens.get(token or "")
        return found is not None and found[0] == ip and found[1] > time.monotonic()

    def role_of(self, instance: Instance) -> tuple[str, str] | None:
        """(role name, role ARN) of the instance's profile, or None without one."""
        if not instance.profile_arn:
            return None
        name = instance.profile_arn.rsplit("/", 1)[-1]
        roles = self.iam().get_instance_profile(InstanceProfileName=name)[
            "InstanceProfile"].get("Roles", [])
        if not roles:
            return None
        return str(roles[0]["RoleName"]), str(roles[0]["Arn"])

    def credentials(self, instance: Instance, role_arn: str) -> dict[str, str]:
        key = (instance.id, role_arn)
        with self._lock:
            found = self._credentials.get(key)
        now = datetime.datetime.now(datetime.UTC)
        if found is not None and _parse(found["Expiration"]) - now > datetime.timedelta(
                seconds=RENEW_BEFORE_S):
            return found
        made = self.assume(role_arn, instance.id, CREDENTIALS_S)
        found = {
            "Code": "Success", "LastUpdated": _format(now), "Type": "AWS-HMAC",
            "AccessKeyId": made["AccessKeyId"], "SecretAccessKey": made["SecretAccessKey"],
            "Token": made["SessionToken"], "Expiration": _format(made["Expiration"]),
        }
        with self._lock:
            self._credentials[key] = found
        return found


def _format(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.UTC)


class ImdsServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, metadata: Metadata, address: tuple[str, int] = (IMDS_IP, IMDS_PORT)
                 ) -> None:
        assert address[0] == IMDS_IP or address[0].startswith("127."), address
        self.metadata = metadata
        super().__init__(address, ImdsHandler)


class ImdsHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ImdsServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: str, content_type: str = "text/plain",
               headers: dict[str, str] | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        self.server.metadata.requests += 1
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.path != "/latest/api/token":
            return self._reply(404, "Not Found")
        try:
            ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds") or "")
        except ValueError:
            return self._reply(400, "Bad Request")
        if not 1 <= ttl <= TOKEN_TTL_MAX_S:
            return self._reply(400, "Bad Request")
        if self.headers.get("X-Forwarded-For"):  # EC2 refuses tokens asked for through proxies
            return self._reply(403, "Forbidden")
        token = self.server.metadata.new_token(self.client_address[0], ttl)
        # As EC2 does: aws-sdk-go (rclone's) reads the TTL back, and refuses a token without.
        self._reply(200, token, headers={"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)})

    def do_GET(self) -> None:
        metadata = self.server.metadata
        metadata.requests += 1
        ip = self.client_address[0]
        if not metadata.token_ok(self.headers.get("X-aws-ec2-metadata-token"), ip):
            return self._reply(401, "Unauthorized")
        instance = metadata.find(ip)
        if instance is None:
            return self._reply(404, "Not Found")
        try:
            answer = self._answer(instance, self.path.split("?", 1)[0])
        except Exception as e:  # moto said no: what EC2 says when it cannot serve
            log.warning("metadata for %s failed: %s", instance.id, e)
            return self._reply(500, "Internal Server Error")
        if answer is None:
            return self._reply(404, "Not Found")
        text, kind = answer
        self._reply(200, text, kind)

    def _answer(self, instance: Instance, path: str) -> tuple[str, str] | None:
        metadata = self.server.metadata
        plain = {
            "/latest/meta-data/instance-id": instance.id,
            "/latest/meta-data/local-ipv4": instance.ip,
            "/latest/meta-data/placement/region": instance.region,
            "/latest/meta-data/placement/availability-zone": instance.zone,
        }
        if path in plain:
            return plain[path], "text/plain"
        if path == "/latest/dynamic/instance-identity/document":
            return json.dumps({"instanceId": instance.id, "region": instance.region,
                               "availabilityZone": instance.zone,
                               "privateIp": instance.ip}), "application/json"
        if not path.startswith("/latest/meta-data/iam/"):
            return None
        role = metadata.role_of(instance)
        if role is None:
            return None  # no profile: EC2 has no iam/ tree for the instance
        name, arn = role
        if path == "/latest/meta-data/iam/info":
            return json.dumps({"Code": "Success", "InstanceProfileArn": instance.profile_arn,
                               }), "application/json"
        if path.rstrip("/") == "/latest/meta-data/iam/security-credentials":
            return name, "text/plain"
        if path == f"/latest/meta-data/iam/security-credentials/{name}":
            return json.dumps(metadata.credentials(instance, arn)), "application/json"
        return None
