"""`clusterctl ssh` on the ssh test bed: the system's ssh, with the options the daemon gives
over the socket, reaches the head (or a worker) as the node's user, checks the key the daemon
pinned, passes stdin, stdout and the exit code through, and needs no `Include` in the ssh
config it reads (this test's ssh runs as root, whose ~/.ssh/config names no cluster). And a
shell's completion offers the cluster's name, which it asks the daemon for."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.sshbed import PREFIX, Bed, ssh_bed

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    with ssh_bed() as made:
        yield made


@pytest.fixture(scope="module")
def pair(bed: Bed) -> str:
    result = bed.daemon.ctl("launch", "-c", "pair", "--infra", "ssh/testbed", "--num-nodes",
                            "2", "--", "true", timeout=900)
    assert result.returncode == 0, result.stderr + bed.daemon.log()[-5000:]
    return "pair"


def test_a_command_on_the_head(bed: Bed, pair: str) -> None:
    result = bed.daemon.ctl("ssh", pair, "--", "hostname")
    assert result.returncode == 0, result.stderr
    assert result.stdout == bed.ssh(0, "hostname").stdout
    who = bed.daemon.ctl("ssh", pair, "--", "whoami;", "echo", "$SSH_CONNECTION")
    assert who.returncode == 0, who.stderr
    user, connection = who.stdout.splitlines()
    assert user == f"{PREFIX}1"
    assert connection.split()[2] == bed.hosts[0]["ip"]  # the head's own address


def test_stdin_reaches_the_command(bed: Bed, pair: str) -> None:
    text = "".join(f"line {n} of what was piped in\n" for n in range(2000))
    result = bed.daemon.ctl("ssh", pair, "--", "cat", input=text)
    assert result.returncode == 0, result.stderr
    assert result.stdout == text


def test_a_worker_and_the_commands_exit_code(bed: Bed, pair: str) -> None:
    result = bed.daemon.ctl("ssh", "--node", "1", pair, "--", "whoami;", "exit", "7")
    assert result.returncode == 7, result.stderr
    assert result.stdout == f"{PREFIX}2\n"
    missing = bed.daemon.ctl("ssh", pair, "--node", "2", "--", "true")
    assert missing.returncode == 1
    assert "has no node 2; its nodes: 0 (head), 1 (worker1)" in missing.stderr


def test_a_cluster_that_does_not_exist(bed: Bed) -> None:
    result = bed.daemon.ctl("ssh", "nosuch", "--", "true")
    assert result.returncode == 102
    assert "cluster nosuch does not exist" in result.stderr


def test_bash_completes_the_clusters_name(bed: Bed, pair: str, tmp_path: Path) -> None:
    names = bed.daemon.ctl("completion", "--cluster-names")
    assert (names.returncode, names.stdout) == (0, f"{pair}\n"), names.stderr
    script = tmp_path / "clusterctl.bash"
    script.write_text(bed.daemon.ctl("completion", "bash").stdout)
    code = (f"source {script}; COMP_WORDS=(clusterctl ssh {pair[:2]}); COMP_CWORD=2; "
            "_clusterctl; echo \"${COMPREPLY[*]}\"")
    offered = subprocess.run(["bash", "-c", code], env=bed.daemon.env, capture_output=True,
                             text=True, timeout=60)
    assert offered.stdout == f"{pair}\n", offered.stderr
