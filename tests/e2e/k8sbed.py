"""The Kubernetes test bed for end-to-end tests: one per test session (a namespace and directory
of its own), and daemons inside it, each with directories (and so a managed-by id) of its own.
The bed is upstream Kubernetes (scripts/testbed k8s): real API server, scheduler, kubelets and
containers; the daemon reaches it only through the kubeconfig's contexts bed-a and bed-b."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support import Daemon, make_env, short_tempdir

ROOT = Path(__file__).resolve().parents[2]
TESTBED = str(ROOT / "scripts" / "testbed")
LABEL_CLOUD_NAME = "clusterd-cluster-name"


@dataclasses.dataclass
class K8sBed:
    dir: Path
    netns: str
    env: dict[str, str]  # what `k8s env` sets

    def testbed(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        n = 2 if args[0] in ("fault",) else 1  # `--dir` goes after the (sub)command
        return subprocess.run([sys.executable, TESTBED, "k8s", *args[:n], "--dir",
                               str(self.dir), *args[n:]], capture_output=True, text=True,
                              timeout=timeout)

    def ok(self, *args: str, timeout: float = 300) -> str:
        done = self.testbed(*args, timeout=timeout)
        assert done.returncode == 0, f"testbed k8s {' '.join(args)}: {done.stderr}{done.stdout}"
        return done.stdout

    def kubectl(self, *args: str) -> str:
        """kubectl as the bed's administrator (every namespace)."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.netns, "kubectl", "--kubeconfig",
             self.env["CLUSTERD_TESTBED_K8S_ADMIN_KUBECONFIG"], *args],
            env=self.env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def objects(self, kind: str, cloud_name: str) -> list[dict[str, Any]]:
        """Every object of `kind` (pods, services, secrets) labelled with the cluster, in
        every namespace."""
        listed = json.loads(self.kubectl("get", kind, "-A", "-o", "json", "-l",
                                         f"{LABEL_CLOUD_NAME}={cloud_name}"))
        return list(listed["items"])

    def pods(self, cloud_name: str) -> list[dict[str, Any]]:
        return self.objects("pods", cloud_name)

    def leftovers(self, cloud_name: str) -> list[str]:
        return [f"{kind}/{o['metadata']['name']}" for kind in ("pods", "services", "secrets")
                for o in self.objects(kind, cloud_name)]

    def status(self) -> dict[str, Any]:
        got: dict[str, Any] = json.loads(self.ok("status", "--json"))
        return got

    def daemon(self, prefix: str, config: str, **extra: str) -> Daemon:
        """A daemon inside the bed, with directories and a config file of its own (not
        started)."""
        root = short_tempdir(prefix)
        env = make_env(root)
        home = root / "home"
        home.mkdir()
        (root / "config.yaml").write_text(config)
        env.update(KUBECONFIG=self.env["KUBECONFIG"],
                   CLUSTERD_WHEELHOUSE_DIR=self.env["CLUSTERD_WHEELHOUSE_DIR"],
                   CLUSTERD_CONFIG=str(root / "config.yaml"), HOME=str(home))
        env["PATH"] = self.env["PATH"]
        env.update(extra)
        return Daemon(root, env, wrap=["ip", "netns", "exec", self.netns])

    @property
    def image(self) -> str:
        """The pods' image: the node image with clusterd's runtime in it (`--runtime-image`)."""
        return self.env["CLUSTERD_TESTBED_K8S_RUNTIME_IMAGE"]


@contextlib.contextmanager
def k8s_bed() -> Iterator[K8sBed]:
    bed_dir = short_tempdir("cdk8e-")
    netns = f"cdk8e-{os.getpid()}"  # not the bed integration tests' name (same process)
    up = subprocess.run([sys.executable, TESTBED, "k8s", "up", "--dir", str(bed_dir),
                         "--netns", netns, "--nodes", "2", "--gpu-nodes", "1",
                         "--runtime-image"], capture_output=True, text=True, timeout=2400)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        env = json.loads(subprocess.run(
            [sys.executable, TESTBED, "k8s", "env", "--dir", str(bed_dir), "--json"],
            capture_output=True, text=True, timeout=60, check=True).stdout)
        yield K8sBed(bed_dir, netns, env)
    finally:
        subprocess.run([sys.executable, TESTBED, "k8s", "down", "--dir", str(bed_dir)],
                       capture_output=True, timeout=300)
        shutil.rmtree(bed_dir, ignore_errors=True)
