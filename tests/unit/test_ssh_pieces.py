"""SSH pieces that need no host: the pools file, "too long" detection, host key pins, ssh
config files, and git checkouts (with a local repository)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import asyncssh
import pytest

from clusterctl.protocol import ProtocolError
from clusterd.agent import node
from clusterd.node_shared.node_commands import GitCheckoutRequest
from clusterd.nodes import NodeInfo, NodeStatus, SSHTarget
from clusterd.providers.ssh_pools import load_pools
from clusterd.ssh.config_files import SSHConfigWriter
from clusterd.ssh.host_keys import HostKeyStore
from clusterd.ssh.runner import is_message_too_long
from tests.support import make_git_repo


def test_pools_file_with_defaults_and_overrides(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_text("k")
    path = tmp_path / "pools.yaml"
    path.write_text(f"gpu:\n  user: ubuntu\n  identity_file: {key}\n  hosts:\n"
                    "    - 10.0.0.1\n    - ip: 10.0.0.2\n      user: alice\n      port: 2200\n")
    pools = load_pools(path)
    assert pools["gpu"].hosts == (
        SSHTarget("10.0.0.1", 22, "ubuntu", str(key)),
        SSHTarget("10.0.0.2", 2200, "alice", str(key)),
    )


@pytest.mark.parametrize(("text", "field"), [
    ("p:\n  hosts: []\n", "p.hosts"),
    ("p:\n  hosts:\n    - ip: 1.2.3.4\n      port: 0\n", "p.hosts[0].port"),
    ("p:\n  hosts:\n    - ip: 1.2.3.4\n      colour: red\n", "p.hosts[0].colour"),
    ("p:\n  password: x\n  hosts: [1.2.3.4]\n", "p.password"),
    ("p:\n  hosts: [1.2.3.4, 1.2.3.4]\n", "p.hosts"),
    ("p:\n  identity_file: /nope\n  hosts: [1.2.3.4]\n", "p.hosts[0].identity_file"),
    ("[1, 2]\n", "(file)"),
])
def test_pools_file_errors_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(text)
    with pytest.raises(ProtocolError) as error:
        load_pools(path)
    assert error.value.message.startswith(f"{path}: {field}:")


def test_missing_pools_file_means_no_pools(tmp_path: Path) -> None:
    assert load_pools(tmp_path / "absent.yaml") == {}


@pytest.mark.parametrize(("code", "output", "expected"), [
    (255, "ssh: command line too long", True),
    (1, "/bin/bash: Argument list too long", True),
    (1, "<html>414 Request-URI Too Large</html>", True),
    (1, "HTTP/1.1 400 Bad Request", True),
    (1, "No such file or directory", False),
    (255, "Connection refused", False),
    (0, "too long", False),
])
def test_message_too_long(code: int, output: str, expected: bool) -> None:
    assert is_message_too_long(code, output) is expected


def test_host_keys_pin_and_forget(tmp_path: Path) -> None:
    store = HostKeyStore(tmp_path / "known_hosts")
    key = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    other = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    assert store.pinned("10.0.0.1", 2222) == []
    store.pin("10.0.0.1", 2222, key)
    store.pin("10.0.0.1", 22, other)
    assert [k.export_public_key() for k in store.pinned("10.0.0.1", 2222)] == [
        key.export_public_key()]
    assert (tmp_path / "known_hosts").read_text().startswith("[10.0.0.1]:2222 ssh-ed25519 ")
    assert (tmp_path / "known_hosts").stat().st_mode & 0o777 == 0o600
    store.forget("10.0.0.1", 2222)
    assert store.pinned("10.0.0.1", 2222) == [] and len(store.pinned("10.0.0.1", 22)) == 1


def test_ssh_config_file_and_include(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "config").write_text("Host mine\n  User me\n")
    writer = SSHConfigWriter(tmp_path / "cfg", tmp_path / "known_hosts")
    nodes = [NodeInfo(f"n{i}", f"10.0.0.{i}", NodeStatus.RUNNING,
                      SSHTarget(f"10.0.0.{i}", 2200 + i, f"u{i}", "/k")) for i in (1, 2)]
    writer.write("dev", nodes)
    writer.write("dev", nodes)  # idempotent: one Include line
    config = (tmp_path / "home" / ".ssh" / "config").read_text()
    assert config.count(writer.include_line) == 1
    assert config.index(writer.include_line) < config.index("Host mine")
    text = (tmp_path / "cfg" / "dev").read_text()
    assert 'Host dev\n  HostName "10.0.0.1"\n  Port 2201\n  User "u1"' in text
    assert 'Host dev-worker1\n  HostName "10.0.0.2"' in text
    assert (f'UserKnownHostsFile "{tmp_path / "known_hosts"}" '
            f'"{tmp_path / "home" / ".ssh" / "known_hosts"}"') in text
    assert (tmp_path / "cfg").stat().st_mode & 0o777 == 0o700
    writer.remove("dev")
    assert not (tmp_path / "cfg" / "dev").exists()
    # A value that could end its line (and start another directive) is never written.
    evil = [NodeInfo("n", "10.0.0.9", NodeStatus.RUNNING,
                     SSHTarget("10.0.0.9", 22, "u", '/k"\n  ProxyCommand touch /tmp/x'))]
    with pytest.raises(ValueError, match="cannot be written"):
        writer.write("evil", evil)
    assert not (tmp_path / "cfg" / "evil").exists()


def _repo(tmp_path: Path) -> Path:
    return make_git_repo(tmp_path / "repo", "one\n", "two\n")


def test_git_checkout_of_a_ref_then_head(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    dest = tmp_path / "work"
    node.git_checkout(GitCheckoutRequest(url=f"file://{repo}", ref="v1", dest=str(dest)))
    assert (dest / "f.txt").read_text() == "one\n"
    (dest / "junk").write_text("left over")
    node.git_checkout(GitCheckoutRequest(url=f"file://{repo}", ref=None, dest=str(dest)))
    assert (dest / "f.txt").read_text() == "two\n" and not (dest / "junk").exists()


def test_git_token_travels_in_the_environment_not_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo(tmp_path)
    seen: list[tuple[list[str], dict[str, str]]] = []
    real_run = subprocess.run

    def spy(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append((list(argv), dict(kwargs.get("env") or {})))  # type: ignore[arg-type]
        return real_run(argv, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(node.subprocess, "run", spy)
    with pytest.raises(node.HelperError):  # nothing serves https there; the set-up is the point
        node.git_checkout(GitCheckoutRequest(
            url="https://git.example.invalid:8443/r.git", ref="v1", dest=str(tmp_path / "w"),
            token="s3cret-token", timeout=30))
    assert seen and all("s3cret-token" not in " ".join(argv) for argv, _ in seen)
    env = seen[0][1]
    assert env["GIT_CONFIG_KEY_0"] == "http.https://git.example.invalid:8443/.extraHeader"
    assert env["GIT_CONFIG_VALUE_0"].startswith("Authorization: Basic ")
    seen.clear()
    done = node.git_checkout(GitCheckoutRequest(url=f"file://{repo}", ref="v1",
                                                dest=str(tmp_path / "f"), token="s3cret-token"))
    assert done.credentials_sent_to is None  # not https: the token is not handed to git at all
    assert all("GIT_CONFIG_KEY_0" not in env for _, env in seen)


def test_ssh_target_from_a_recorded_host_and_back() -> None:
    recorded = {"host": "127.0.0.2", "port": "2322", "user": "cdt1", "cpus": 2.0,
                "memory_gb": 1.5}
    target = SSHTarget.from_json(recorded)
    assert target == SSHTarget("127.0.0.2", 2322, "cdt1", None)
    assert str(target) == "cdt1@127.0.0.2:2322"
    pinned = SSHTarget("10.0.0.5", 22, "alice", "/k")
    assert SSHTarget.from_json(pinned.to_json()) == pinned


@pytest.mark.anyio
async def test_remote_mkdir_takes_home_only_at_the_start_and_ends_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterd.commands import CommandResult
    from clusterd.ssh import runner as runner_module

    seen: list[list[str]] = []

    async def run(self: object, argv: list[str], **kwargs: object) -> CommandResult:
        seen.append(list(argv))
        return CommandResult(0, b"", b"")

    async def rsync(self: object, *args: object) -> None:
        return None

    monkeypatch.setattr(runner_module.SSHRunner, "run", run)
    monkeypatch.setattr(runner_module.SSHRunner, "_rsync", rsync)
    node = runner_module.SSHRunner(None, SSHTarget("h", 22, "u"), "n", "python3",  # type: ignore[arg-type]
                                   tmp_path)
    await node.sync_dir(str(tmp_path), "~/sky_workdir")
    await node.sync_dir(str(tmp_path), "/data/~/x")
    await node.put_path(str(tmp_path / "f"), "~/f.txt")
    await node.put_path(str(tmp_path / "f"), "-rf/x")
    assert seen == [["mkdir", "-p", "--", "sky_workdir"], ["mkdir", "-p", "--", "/data/~/x"],
                    ["mkdir", "-p", "--", "."], ["mkdir", "-p", "--", "-rf"]]
