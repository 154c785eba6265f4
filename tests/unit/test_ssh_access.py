"""`clusterctl ssh` (op `ssh`): the daemon answers with the options of the node's Host block in
the `ssh CLUSTER` config file, which OpenSSH takes as `-o` options; a node it does not have, one
with no address, or a local cluster is refused with a hint."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from clusterctl import _argv_cache
from clusterctl._ssh_cli import ssh_argv
from clusterctl.cli import parse
from clusterctl.protocol import ClusterStatus, ErrorCode, ProtocolError
from clusterd.nodes import ClusterInfo, NodeInfo, NodeStatus, SSHTarget
from clusterd.services.ssh_access import ssh_access
from clusterd.ssh.config_files import SSHConfigWriter
from clusterd.state.clusters import ClusterRecord
from clusterd.tasks.spec import ResourceRequest
from tests.support import needs_tool

PROXY = "python3 -m clusterd.ssh.unix_connect '/run/a dir/pod.sock'"


def record(provider: str = "ssh") -> ClusterRecord:
    return ClusterRecord("dev", provider, "dev-1", ClusterStatus.UP, 2, ResourceRequest(), "",
                         0.0, 0.0)


def cluster() -> ClusterInfo:
    return ClusterInfo((
        NodeInfo("head", "10.0.0.1", NodeStatus.RUNNING,
                 SSHTarget("10.0.0.1", 2201, "alice", "/keys/id", "i-0abc", PROXY)),
        NodeInfo("w1", "10.0.0.2", NodeStatus.RUNNING, SSHTarget("10.0.0.2", 22, "bob")),
        NodeInfo("w2", "", NodeStatus.TERMINATED, None, reason="the instance no longer exists"),
    ))


@pytest.fixture
def writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SSHConfigWriter:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return SSHConfigWriter(tmp_path / "cfg", tmp_path / "known_hosts")


def test_the_options_are_the_host_block_of_the_config_file(writer: SSHConfigWriter) -> None:
    writer.write("dev", list(cluster().nodes))
    _comment, text = (writer.directory / "dev").read_text().split("\n", 1)
    blocks = text.rstrip("\n").split("\n\n")
    for index, block in ((0, blocks[0]), (1, blocks[1])):
        access = ssh_access(record(), cluster(), index, writer)
        assert access["alias"] == ("dev" if index == 0 else "dev-worker1")
        assert access["node_id"] == ("head", "w1")[index]
        assert block.splitlines()[1:] == [f"  {line}" for line in access["options"]]
    assert 'IdentityFile "/keys/id"' in ssh_access(record(), cluster(), 0, writer)["options"]


def test_openssh_takes_them_as_options(writer: SSHConfigWriter, tmp_path: Path) -> None:
    """`ssh -G` prints the configuration ssh would connect with, without connecting."""
    ssh = needs_tool("ssh", "openssh-client")
    access = ssh_access(record(), cluster(), 0, writer)
    argv = ssh_argv(access, ["echo", "hi"])
    assert argv[-4:] == ["--", "dev", "echo", "hi"]
    shown = subprocess.run([ssh, "-G", "-F", "/dev/null", *argv[1:-2]],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    expected = {"hostname 10.0.0.1", "port 2201", "user alice", "hostkeyalias i-0abc",
                f"proxycommand {PROXY}", "identityfile /keys/id", "identitiesonly yes",
                "stricthostkeychecking true",
                f"userknownhostsfile {tmp_path / 'known_hosts'} "
                f"{tmp_path / 'home' / '.ssh' / 'known_hosts'}"}
    assert expected <= set(shown), sorted(expected - set(shown))
    assert shlex.split(PROXY)[-1] == "/run/a dir/pod.sock"  # the space survived, unquoted


def test_a_command_that_starts_with_a_dash_is_not_an_option_of_ssh() -> None:
    argv = ssh_argv({"alias": "dev", "options": ["Port 22"]}, ["-v"])
    assert argv == ["ssh", "-o", "Port 22", "--", "dev", "-v"]


@pytest.mark.parametrize(("index", "provider", "code", "words"), [
    (3, "aws", ErrorCode.INVALID_ARGUMENT, "has no node 3; its nodes: 0 (head), 1 (worker1)"),
    (2, "aws", ErrorCode.NODE_UNREACHABLE, "is terminated (the instance no longer exists)"),
])
def test_a_node_it_cannot_reach(writer: SSHConfigWriter, index: int, provider: str,
                                code: ErrorCode, words: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        ssh_access(record(provider), cluster(), index, writer)
    assert refused.value.code == code and words in refused.value.message


def test_a_local_cluster_has_nothing_to_ssh_to(writer: SSHConfigWriter) -> None:
    local = ClusterInfo((NodeInfo("local", "127.0.0.1", NodeStatus.RUNNING, None,
                                  workdir="/state/dev/sky_workdir"),))
    with pytest.raises(ProtocolError) as refused:
        ssh_access(record("local"), local, 0, writer)
    assert refused.value.code == ErrorCode.UNSUPPORTED
    assert "runs on this machine" in refused.value.message
    assert "/state/dev/sky_workdir" in refused.value.hint
    assert "clusterctl exec dev -- CMD" in refused.value.hint


def test_an_ssh_command_line_is_never_kept(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A command typed for a remote shell may hold anything (a token in an export): it is
    parsed each time, never kept at rest by the parse cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    words = ["ssh", "dev", "--", "export", "API_KEY=s3cret;", "./run"]
    _argv_cache.keep(words, parse(words))
    assert _argv_cache.recall(words) is None
    assert not (tmp_path / "clusterd" / _argv_cache.FILE_NAME).exists()
