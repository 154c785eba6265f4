"""The fingerprints EC2 reports for a key pair imported from the daemon's public key, checked
against OpenSSH's own `ssh-keygen -l` (the form EC2 documents for ED25519 keys) and against
what moto's EC2 computes (the endpoint the tests and the test bed use)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import asyncssh
from moto.ec2.utils import public_key_fingerprint, public_key_parse, select_hash_algorithm

from clusterd.providers.aws.network import key_pair_fingerprints, same_fingerprint
from tests.support import needs_tool


def ed25519_public() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()


def test_the_sha256_form_is_openssh_s(tmp_path: Path) -> None:
    needs_tool("ssh-keygen", "openssh-client")
    public = ed25519_public()
    (tmp_path / "key.pub").write_text(public + "\n")
    listed = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(tmp_path / "key.pub")],
                            capture_output=True, text=True, check=True).stdout.split()[1]
    assert listed.startswith("SHA256:")
    fingerprints = key_pair_fingerprints(public)
    # As EC2 shows it: base64 with its padding, no prefix; as ssh-keygen does: the reverse.
    assert same_fingerprint(listed.removeprefix("SHA256:") + "=", fingerprints)
    assert same_fingerprint(listed, fingerprints)


def test_moto_s_form_matches_and_another_key_does_not() -> None:
    public = ed25519_public()
    parsed = public_key_parse(public.encode())
    reported = public_key_fingerprint(parsed, select_hash_algorithm(parsed))
    assert same_fingerprint(reported, key_pair_fingerprints(public))
    assert same_fingerprint(reported.upper(), key_pair_fingerprints(public))
    other = ed25519_public()
    assert not same_fingerprint(reported, key_pair_fingerprints(other))
    assert not same_fingerprint("", key_pair_fingerprints(public))


def test_rsa_keys_match_ec2_s_md5_forms() -> None:
    public = asyncssh.generate_private_key("ssh-rsa", key_size=2048).export_public_key(
        ).decode().strip()
    parsed = public_key_parse(public.encode())
    reported = public_key_fingerprint(parsed, select_hash_algorithm(parsed))  # MD5 of the DER
    assert len(reported.split(":")) == 16
    assert same_fingerprint(reported, key_pair_fingerprints(public))
