"""GIT_TOKEN goes only to the workdir URL's own origin, over https: real git against real
HTTPS and HTTP servers on loopback that record what they are sent."""

from __future__ import annotations

import base64
import datetime
import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from clusterd.agent import node
from clusterd.node_shared.node_commands import GitCheckoutRequest

TOKEN = "ghp_s3cr3t-" + "x" * 20


def _certificate(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class Server:
    """Records each request's path and headers; redirects to `redirect` if set, else 404."""

    def __init__(self, host: str, tls: ssl.SSLContext | None) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.redirect: str | None = None
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append((self.path, dict(self.headers)))
                if outer.redirect:
                    self.send_response(302)
                    self.send_header("Location", outer.redirect + self.path)
                else:
                    self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.scheme = "https" if tls else "http"
        self.url = f"{self.scheme}://{host}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def authorizations(self) -> list[str]:
        return [h.get("Authorization", "") for _, h in self.requests]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Server]]:
    cert, key = _certificate(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    monkeypatch.setenv("GIT_SSL_NO_VERIFY", "1")  # our self-signed certificate
    made = {"origin": Server("127.0.0.2", tls), "other": Server("127.0.0.3", tls),
            "plain": Server("127.0.0.2", None)}
    try:
        yield made
    finally:
        for server in made.values():
            server.close()


def checkout(url: str, dest: Path) -> str:
    with pytest.raises(node.HelperError) as failed:
        node.git_checkout(GitCheckoutRequest(url=url, ref="main", dest=str(dest), token=TOKEN,
                                             timeout=60))
    assert TOKEN not in str(failed.value)
    return str(failed.value)


def test_the_token_reaches_the_https_origin_and_no_other(servers: dict[str, Server],
                                                         tmp_path: Path) -> None:
    origin, other = servers["origin"], servers["other"]
    origin.redirect = other.url  # the origin sends git elsewhere
    checkout(f"{origin.url}/repo.git", tmp_path / "w")
    expected = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    assert origin.requests and origin.authorizations()[0] == expected
    assert other.requests, "git did not follow the redirect: the test proves nothing"
    assert all(not auth for auth in other.authorizations())


def test_the_token_never_goes_over_plain_http(servers: dict[str, Server],
                                              tmp_path: Path) -> None:
    plain = servers["plain"]
    checkout(f"{plain.url}/repo.git", tmp_path / "w")
    assert plain.requests and all(not auth for auth in plain.authorizations())


def test_credentials_in_the_url_are_not_repeated_in_errors(servers: dict[str, Server],
                                                           tmp_path: Path) -> None:
    origin = servers["origin"]
    host = origin.url.removeprefix("https://")
    message = checkout(f"https://alice:hunter2-in-url@{host}/repo.git", tmp_path / "w")
    assert "hunter2-in-url" not in message


def test_refs_and_urls_that_look_like_options_are_refused(tmp_path: Path) -> None:
    for params in ({"url": "--upload-pack=touch /tmp/x", "ref": "main"},
                   {"url": "https://h/r.git", "ref": "--upload-pack=touch /tmp/x"}):
        with pytest.raises(node.HelperError, match="may not start with '-'"):
            node.git_checkout(GitCheckoutRequest.from_dict({**params, "dest": str(tmp_path / "w")}))


def test_url_credentials_go_in_a_header_and_stay_out_of_the_checkout(
        servers: dict[str, Server], tmp_path: Path) -> None:
    origin = servers["origin"]
    host = origin.url.removeprefix("https://")
    checkout(f"https://alice:pw%40x@{host}/repo.git", tmp_path / "w")
    expected = "Basic " + base64.b64encode(b"alice:pw@x").decode()
    assert origin.authorizations()[0] == expected
    config = (tmp_path / "w" / ".git" / "config").read_text()
    assert f"url = https://{host}/repo.git" in config and "alice" not in config
    with pytest.raises(node.HelperError, match="only over https"):
        node.git_checkout(GitCheckoutRequest(
            url=f"{servers['plain'].url.replace('://', '://a:b@')}/r.git",
            dest=str(tmp_path / "p")))
    assert not servers["plain"].requests
