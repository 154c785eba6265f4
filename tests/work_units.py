"""How scripts/test splits the suite over pytest-xdist's workers (tests/conftest.py installs it).

A module is one unit of work: its module fixtures are made once. The modules of the EC2 and
Kubernetes beds are one unit together, and the ssh bed's another (see BEDS below). A module's
bed is read from its source (the fixture or mark it names), since the controller that
schedules sees node ids only.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

# Every module that makes or uses an EC2 or Kubernetes bed is one unit, run in collection order
# as the whole suite once ran in one process: beds of a kind share the machine's `ubuntu` user
# and kernel settings (scripts/_testbed/common/host.py), and a bed going up or down while
# another worker's bed of the kind starts is a case their registry was not shown to survive
# (a two-worker run saw an image-root bed's nodes refuse the key). The ssh bed's fixed users
# and port make its modules a unit of their own.
BEDS = re.compile(r"\bk8s: K8sBed\b|\bec2: EC2Bed\b|\(ec2\)|\b(ec2_bed|k8s_bed)\(|K8S_BEDS|"
                  r"\bpytest\.mark\.(k8s|ec2)\b")
SSH_BED = re.compile(r"\bssh_bed\b")


@functools.cache
def unit_of(root: Path, module: str) -> str:
    try:
        source = (root / module).read_text()
    except OSError:
        return module
    if BEDS.search(source):
        return "beds"
    if SSH_BED.search(source):
        return "ssh-bed"
    return module


class BedGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self._root = Path(config.rootpath)

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(self._root, nodeid.split("::", 1)[0])
