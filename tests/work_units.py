"""How scripts/test splits the suite over pytest-xdist's workers (tests/conftest.py installs it).

A module is one unit of work: its module fixtures are made once. The modules that share one of
the session's beds (the EC2 bed, the Kubernetes bed: tests/e2e/conftest.py; the ssh bed's fixed
users and port: tests/e2e/sshbed.py) are one unit too: each bed is made by one worker, once.
A module's bed is read from its source (the fixture it names), since the controller that
schedules sees node ids only. Modules that make beds of their own (test_testbed_*,
test_aws_iam_bed, test_ec2_images) stay units of their own: beds of a kind run side by side
(scripts/_testbed/common/host.py keeps their registry).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

# (group, what in a module's source says it uses that shared bed), first match wins: a module
# on both session beds (cross-provider failover) goes with the shorter group, Kubernetes.
SHARED_BEDS = (
    ("k8s-bed", re.compile(r"\bk8s: K8sBed\b")),
    ("ec2-bed", re.compile(r"\bec2: EC2Bed\b|\(ec2\)")),
    ("ssh-bed", re.compile(r"\bssh_bed\b")),
)
OWN_BED = re.compile(r"\b(ec2_bed|k8s_bed)\(")


@functools.cache
def unit_of(root: Path, module: str) -> str:
    try:
        source = (root / module).read_text()
    except OSError:
        return module
    for group, uses in SHARED_BEDS:
        if uses.search(source) and not (group != "ssh-bed" and OWN_BED.search(source)):
            return group
    return module


class BedGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self._root = Path(config.rootpath)

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(self._root, nodeid.split("::", 1)[0])
