"""Building Kubernetes for the bed, once per machine and package version: kube-apiserver,
kube-controller-manager, kube-scheduler, kubelet, kube-proxy and kubectl from Debian's
`kubernetes` source package (upstream v1.20.2 with vendor/), with Debian's Go 1.19; etcd and
containerd from Debian's binary packages; the pause image from the tree's build/pause.

The cache is CACHE/VERSION (VERSION: the source package's), with bin/ and images/, and
build-info.json written last (its presence means "built"). The work directory beside it
(VERSION.build: the tree, GOPATH, Go's cache; about 3.5 GB) goes once the build succeeds.
Nothing is installed and nothing goes into the repository. The traps, each handled below:
Debian's patches; reflect2 1.0.1 crashing under Go >= 1.18; pkg/generated/openapi missing from
the tarball; module mode wanting go.mod updates (so GOPATH mode); `/version` saying v0.0.0
without the -X flags. Standard library only.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import tarfile
import time

from _testbed.common import Failure, log, run, write_file
from _testbed.k8s import apt
from _testbed.k8s.images import oci_archive
from _testbed.k8s.layout import PAUSE_TAG, pause_image

GIT_VERSION = "v1.20.2"  # what the source package holds ("1.20.5+really1.20.2")
COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
            "kube-proxy", "kubectl")
GO_PKG = "k8s.io/kubernetes"
BUILD_TIMEOUT_S = 3600.0
INFO_FILE = "build-info.json"


def cached(version_dir: str) -> bool:
    return os.path.isfile(os.path.join(version_dir, INFO_FILE))


def build_info(version_dir: str) -> dict[str, object]:
    with open(os.path.join(version_dir, INFO_FILE)) as f:
        info: dict[str, object] = json.load(f)
    return info


def go_env(work: str, goroot: str) -> dict[str, str]:
    return {"PATH": f"{goroot}/bin:/usr/bin:/bin", "HOME": work, "GOROOT": goroot,
            "GOPATH": os.path.join(work, "gopath"), "GOCACHE": os.path.join(work, "gocache"),
            "GO111MODULE": "off", "GOPROXY": "off", "GOFLAGS": "", "CGO_ENABLED": "0",
            "GOTOOLCHAIN": "local", "LANG": "C.UTF-8"}


def in_gopath(env: dict[str, str], cwd: str) -> dict[str, str]:
    """env for a tool run in cwd, a path through GOPATH's symlink to the tree: Go's
    os.Getwd trusts $PWD, and without it the tree resolves to its real path, outside GOPATH
    (then vendor/ is not vendor: openapi-gen fails with "invalid type")."""
    return {**env, "PWD": cwd}


def go(env: dict[str, str], cwd: str, *args: str) -> None:
    p = subprocess.run(["nice", "-n", "10", "go", *args], cwd=cwd, env=in_gopath(env, cwd),
                       text=True,
                       capture_output=True, stdin=subprocess.DEVNULL, timeout=BUILD_TIMEOUT_S)
    if p.returncode != 0:
        raise Failure(f"go {' '.join(args[:2])} ... failed (exit {p.returncode}):\n"
                      f"{(p.stderr or p.stdout).strip()[-3000:]}")


def apply_patches(tree: str, debian: str) -> list[str]:
    """Debian's patches, in series order (as dpkg-source would)."""
    series = os.path.join(debian, "patches", "series")
    names = []
    with open(series) as f:
        for line in f:
            name = line.split("#", 1)[0].strip()
            if name:
                names.append(name.split()[0])
    for name in names:
        with open(os.path.join(debian, "patches", name)) as patch:
            p = subprocess.run(["patch", "-p1", "-s", "--no-backup-if-mismatch", "-N"],
                               cwd=tree, stdin=patch, capture_output=True, text=True)
        if p.returncode != 0:
            raise Failure(f"Debian's patch {name} does not apply: {p.stdout}{p.stderr}")
    return names


def replace_reflect2(tree: str, tools: str) -> None:
    """vendor's reflect2 1.0.1 crashes under Go >= 1.18 (modern-go/reflect2#24): use Debian's
    1.0.2 sources instead."""
    new = os.path.join(tools, "usr/share/gocode/src/github.com/modern-go/reflect2")
    old = os.path.join(tree, "vendor/github.com/modern-go/reflect2")
    if not os.path.isdir(new) or not os.path.isdir(old):
        raise Failure(f"cannot replace reflect2: {new} or {old} is missing")
    for path in glob.glob(os.path.join(old, "*")):
        if path.endswith((".go", ".s")):
            os.unlink(path)
    for path in glob.glob(os.path.join(new, "*")):
        if path.endswith((".go", ".s")):
            shutil.copy(path, old)


def openapi_dirs(tree: str) -> list[str]:
    """The directories upstream's Makefile.generated_files runs openapi-gen over for
    pkg/generated/openapi: every Go directory of the tree (staging/src named as vendor/, the
    rest of vendor/ left out) with a file carrying a `// +k8s:` tag at column 0 that mentions
    `+k8s:openapi-gen=`, except code-generator's and sample-apiserver's."""
    tag = re.compile(r"^// *\+k8s:", re.M)
    out = set()
    for root, dirs, files in os.walk(tree):
        rel = os.path.relpath(root, tree)
        if rel == ".":
            dirs[:] = [d for d in dirs if d != "vendor" and not d.startswith(("_", "."))]
        name = "vendor" + rel[len("staging/src"):] if rel.startswith("staging/src/") else rel
        if name.startswith(("vendor/k8s.io/code-generator/", "vendor/k8s.io/sample-apiserver/")):
            continue
        for f in files:
            if not f.endswith(".go"):
                continue
            with open(os.path.join(root, f), errors="replace") as fh:
                text = fh.read()
            if tag.search(text) and "+k8s:openapi-gen=" in text:
                out.add(name)
                break
    return sorted(out)


def generate_openapi(tree: str, work: str, env: dict[str, str]) -> None:
    src = os.path.join(env["GOPATH"], "src", GO_PKG)
    tool = os.path.join(work, "tools", "openapi-gen")
    go(env, src, "build", "-o", tool, f"{GO_PKG}/vendor/k8s.io/kube-openapi/cmd/openapi-gen")
    report = os.path.join(work, "openapi-violations.report")
    inputs = ",".join(f"{GO_PKG}/{d}" for d in openapi_dirs(tree))
    p = subprocess.run(["nice", "-n", "10", tool, "--logtostderr", "-i", inputs,
                        "-p", f"{GO_PKG}/pkg/generated/openapi", "-O", "zz_generated.openapi",
                        "-h", "vendor/k8s.io/code-generator/hack/boilerplate.go.txt",
                        "-r", report], cwd=src, env=in_gopath(env, src), capture_output=True,
                       text=True, timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise Failure(f"openapi-gen failed: {(p.stderr or p.stdout).strip()[-3000:]}")
    with open(report) as f:
        got = set(f.read().split())
    with open(os.path.join(tree, "api/api-rules/violation_exceptions.list")) as f:
        want = set(f.read().split())
    if got != want:  # the input list is not upstream's: some API types would lack schemas
        raise Failure(f"openapi-gen's API rule report differs from upstream's list "
                      f"({len(got - want)} extra, {len(want - got)} missing), e.g. "
                      f"{sorted(got ^ want)[:3]}")


def ldflags(build_date: str) -> str:
    minor = GIT_VERSION.split(".")[1]
    values = {"gitVersion": GIT_VERSION, "gitMajor": "1", "gitMinor": minor,
              "gitTreeState": "archive", "buildDate": build_date}
    flags = ["-s", "-w"]
    for package in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        for key, value in values.items():
            flags.append(f"-X '{GO_PKG}/vendor/{package}.{key}={value}'")
    return " ".join(flags)


def build_pause(tree: str, out_dir: str) -> str:
    """The tree's pause, static, as an image archive. Returns the archive's path."""
    binary = os.path.join(out_dir, "pause")
    run(["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{PAUSE_TAG}-clusterd-testbed",
         "-o", binary, os.path.join(tree, "build/pause/linux/pause.c")], timeout=300)
    layer = os.path.join(out_dir, "pause-layer.tar")
    with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as t:
        info = t.gettarinfo(binary, "pause")
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mode = 0o755
        with open(binary, "rb") as f:
            t.addfile(info, f)
    archive = os.path.join(out_dir, "images", "pause.tar")
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    oci_archive(archive, pause_image(), [layer], {"Entrypoint": ["/pause"]})
    os.unlink(layer)
    return archive


def ensure_built(root: str, version: str | None = None) -> str:
    """CACHE/VERSION with everything built: found, or built now (minutes). Returns it."""
    os.makedirs(root, mode=0o755, exist_ok=True)
    pkgs = apt.Apt(os.path.join(root, "apt"))
    version = version or apt.machine_version()
    if version and cached(os.path.join(root, version)):
        return os.path.join(root, version)
    from _testbed.common import lock_dir

    lock = lock_dir(root)  # one build at a time on this machine
    try:
        if version and cached(os.path.join(root, version)):
            return os.path.join(root, version)
        if not pkgs.has_lists() or (version and pkgs.source_version() != version):
            pkgs.update()
        found = pkgs.source_version()
        if found is None:
            raise Failure("Debian's source index has no `kubernetes` source package",
                          hint="the bed builds from Debian bookworm's `kubernetes` source")
        if version and found != version:
            log(f"  the machine's index says kubernetes {version}, the source index has "
                f"{found}: building {found}")
        version = found
        final = os.path.join(root, version)
        if not cached(final):
            build(pkgs, version, final)
        return final
    finally:
        os.close(lock)


def build(pkgs: apt.Apt, version: str, final: str) -> None:
    work = final + ".build"
    partial = final + ".partial"
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(os.path.join(partial, "bin"))
    start = time.monotonic()
    log(f"building Kubernetes {GIT_VERSION} from Debian's source package {version} "
        f"(once per machine and version; about 6 minutes on 2 cores) in {work} ...")
    downloads = os.path.join(work, "downloads")
    pkgs.download_source(version, downloads)
    versions = pkgs.download(apt.TOOL_PACKAGES + apt.RUNTIME_PACKAGES, downloads)
    tools = os.path.join(work, "tools")
    for package in (*apt.TOOL_PACKAGES, *apt.RUNTIME_PACKAGES):
        apt.extract(apt.find_deb(downloads, package), tools)
    goroot = os.path.join(tools, "usr/lib/go-1.19")
    src = os.path.join(work, "src")
    os.makedirs(src)
    (orig,) = glob.glob(os.path.join(downloads, "kubernetes_*.orig.tar.gz"))
    (debian,) = glob.glob(os.path.join(downloads, "kubernetes_*.debian.tar.xz"))
    run(["tar", "-C", src, "-xzf", orig], timeout=600)
    run(["tar", "-C", src, "-xJf", debian], timeout=600)
    (tree,) = [d for d in glob.glob(os.path.join(src, "kubernetes-*")) if os.path.isdir(d)]
    patches = apply_patches(tree, os.path.join(src, "debian"))
    replace_reflect2(tree, tools)
    env = go_env(work, goroot)
    gopath_pkg = os.path.join(env["GOPATH"], "src", GO_PKG)
    os.makedirs(os.path.dirname(gopath_pkg))
    os.symlink(tree, gopath_pkg)
    t = time.monotonic()
    generate_openapi(tree, work, env)
    log(f"  openapi-gen: {time.monotonic() - t:.0f}s")
    t = time.monotonic()
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    go(env, gopath_pkg, "build", "-p", str(os.cpu_count() or 2), "-ldflags", ldflags(date),
       "-o", os.path.join(partial, "bin") + "/", *(f"{GO_PKG}/cmd/{c}" for c in COMMANDS))
    go_s = time.monotonic() - t
    log(f"  go build ({', '.join(COMMANDS)}): {go_s:.0f}s")
    for binary in ("usr/bin/etcd", "usr/bin/containerd", "usr/bin/containerd-shim-runc-v2",
                   "usr/bin/ctr"):
        shutil.copy2(os.path.join(tools, binary), os.path.join(partial, "bin"))
    build_pause(tree, partial)
    got = run([os.path.join(partial, "bin", "kube-apiserver"), "--version"]).stdout.strip()
    if got != f"Kubernetes {GIT_VERSION}":
        raise Failure(f"the built kube-apiserver says {got!r}, not Kubernetes {GIT_VERSION}")
    go_version = run([os.path.join(goroot, "bin", "go"), "version"]).stdout.strip()
    info = {"package": apt.SOURCE_PACKAGE, "package_version": version,
            "kubernetes": GIT_VERSION, "go": go_version, "patches": patches,
            "debs": versions, "built_at": date, "build_seconds": round(time.monotonic() - start),
            "go_build_seconds": round(go_s), "commands": list(COMMANDS)}
    write_file(os.path.join(partial, INFO_FILE), json.dumps(info, indent=2) + "\n")
    os.rename(partial, final)
    with contextlib.suppress(OSError):
        shutil.rmtree(work)
    log(f"built Kubernetes {GIT_VERSION} in {time.monotonic() - start:.0f}s: {final}")
