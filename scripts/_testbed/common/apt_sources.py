"""The machine's Debian sources, read (never written): the mirror both beds' debootstrap takes
suites from, and the Kubernetes bed's own apt configuration (k8s/apt.py). Standard library
only."""

from __future__ import annotations

import glob
import re

from _testbed.common import Failure

_FIELD_RE = re.compile(r"^([A-Za-z-]+):\s*(.*)$")


def machine_sources() -> list[dict[str, str]]:
    """The machine's enabled Debian sources (deb822 files and one-line entries), as deb822
    stanzas with Types: deb. Other vendors' repositories are left out: the bed needs Debian's."""
    stanzas: list[dict[str, str]] = []
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        with open(path) as f:
            for block in f.read().split("\n\n"):
                fields: dict[str, str] = {}
                for line in block.splitlines():
                    m = _FIELD_RE.match(line)
                    if m and not line.startswith("#"):
                        fields[m.group(1)] = m.group(2).strip()
                if fields.get("Enabled", "yes") != "no" and "deb" in fields.get("Types", ""):
                    stanzas.append(fields)
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            words = line.split("#", 1)[0].split()
            if len(words) >= 4 and words[0] == "deb":
                options = ""
                if words[1].startswith("["):
                    end = next(i for i, w in enumerate(words) if w.endswith("]"))
                    options, words = " ".join(words[1:end + 1]), [words[0], *words[end + 1:]]
                stanza = {"Types": "deb", "URIs": words[1], "Suites": words[2],
                          "Components": " ".join(words[3:])}
                m = re.search(r"signed-by=(\S+?)\]?(\s|$)", options)
                if m:
                    stanza["Signed-By"] = m.group(1)
                stanzas.append(stanza)
    debian = [s for s in stanzas if "debian" in s.get("URIs", "")]
    if not debian:
        raise Failure("the machine's apt sources name no Debian mirror",
                      hint="the Kubernetes test bed builds from Debian's packages")
    return debian
