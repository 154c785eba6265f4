"""The runtime's wheelhouse (runtime/install.py, runtime/wheelhouse.py) with real files, a
real second Linux user, a real pip and uv: a wheelhouse someone else could have written is
refused, so is one whose files are not the ones recorded at its build (on this machine before
the copy, and on the node before pip installs anything), and a key and a marker are not
enough to pass for one. One real wheelhouse is built for the module (the package index once,
about 15 s)."""

from __future__ import annotations

import concurrent.futures
import csv
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import anyio
import pytest
import zstandard

from clusterctl.protocol import ProtocolError
from clusterd.commands import CommandResult
from clusterd.runtime import build_lock, install, slim, venv_archive
from clusterd.runtime.install import (
    BEHIND_HEAD_NICENESS,
    Wheelhouse,
    WheelhouseBuilder,
    linked_or_probed,
    wheelhouse_key,
)
from clusterd.runtime.node_install import install_runtime
from clusterd.runtime.runner import LocalRunner
from clusterd.runtime.venv_archive import PYTHON_TAG
from clusterd.runtime.wheelhouse import HASHED_REQUIREMENTS, SUMS, WheelhouseRefused
from tests.support import other_user, short_tempdir


def checkout_listing() -> dict[str, float]:
    """The checkout's top level and the mtimes of what a build in place would write."""
    source = Path(install.__file__).resolve().parents[3]
    return {p.name: p.stat().st_mtime for p in source.iterdir()}


@pytest.fixture(scope="module")
def built() -> Iterator[Wheelhouse]:
    """Built by two daemons at once, as the suite's two workers (or a user's two state dirs)
    do: one builds, the other waits and takes it; the checkout gets no build output (two
    setuptools builds in one tree collided on its build/ directory)."""
    root = short_tempdir("cdwh-")
    builds: list[str] = []
    build_new = WheelhouseBuilder._build_new

    def counted(self: WheelhouseBuilder, key: str, final: Path) -> Wheelhouse:
        builds.append(key)
        return build_new(self, key, final)

    before = checkout_listing()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(WheelhouseBuilder, "_build_new", counted)
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                houses = list(pool.map(lambda _: WheelhouseBuilder(root / "wheelhouse").build(),
                                       range(2)))
        assert len(builds) == 1, builds
        assert houses[0].path == houses[1].path
        assert checkout_listing() == before
        yield houses[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_second_builder_waits_for_the_first_then_says_who_holds_it(tmp_path: Path) -> None:
    with build_lock.one_builder(tmp_path, "k1"):
        # the lock is the open file's: a second open in this process waits like a daemon's
        with pytest.raises(ProtocolError) as held, build_lock.one_builder(tmp_path, "k1",
                                                                           wait_s=0.3):
            pass
        with build_lock.one_builder(tmp_path, "k2", wait_s=0.3):
            pass  # another key builds meanwhile
    assert str(tmp_path / ".k1.lock") in held.value.message
    assert "fuser" in held.value.hint
    with build_lock.one_builder(tmp_path, "k1", wait_s=0.3):
        pass  # released when its holder is done


@pytest.fixture
def node(place: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node's login directory (and HOME) on this machine, where installs run."""
    home = place / "node"
    home.mkdir()
    monkeypatch.chdir(home)
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def place(tmp_path: Path) -> Path:
    return tmp_path


def copy_of(built: Wheelhouse, place: Path) -> Path:
    """A wheelhouse root holding a copy of the built wheelhouse (its own files to spoil)."""
    root = place / "wheelhouse"
    shutil.copytree(built.path.parent, root, symlinks=True)
    return root


def refusal(root: Path) -> str:
    with pytest.raises(WheelhouseRefused) as refused:
        WheelhouseBuilder(root).build()
    return refused.value.message


def spoil(wheel: Path) -> None:
    """Change a wheel as someone could: still a zip pip would install."""
    with open(wheel, "ab") as f:
        f.write(b"\0planted")


def test_a_wheelhouse_of_another_user_is_refused(place: Path) -> None:
    root = place / "wheelhouse"
    root.mkdir(mode=0o755)
    with other_user() as mallory:
        os.chown(root, mallory.uid, mallory.gid)
        message = refusal(root)
        assert message.startswith(f"refusing the runtime's wheelhouse: {root} belongs to "
                                  f"{mallory.name}"), message
        # Nor a KEY directory of theirs in a root of ours.
        os.chown(root, os.getuid(), os.getgid())
        (root / wheelhouse_key()).mkdir(mode=0o755)
        os.chown(root / wheelhouse_key(), mallory.uid, mallory.gid)
        assert f"{root / wheelhouse_key()} belongs to {mallory.name}" in refusal(root)


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_wheelhouse_others_may_write_to_is_refused(place: Path, mode: int,
                                                     built: Wheelhouse) -> None:
    root = copy_of(built, place)
    root.chmod(mode)
    assert f"{root} has mode {mode:04o}: others may write there" in refusal(root)
    root.chmod(0o755)
    key_dir = root / built.key
    key_dir.chmod(mode)
    assert f"{key_dir} has mode {mode:04o}" in refusal(root)


def test_a_key_and_a_ready_marker_do_not_make_a_wheelhouse(place: Path) -> None:
    """Knowing the key (version, Python, code digest: nothing secret) is not enough."""
    forged = place / "wheelhouse" / wheelhouse_key()
    forged.mkdir(parents=True)
    (forged / ".clusterd-ready").write_text(wheelhouse_key() + "\n")
    (forged / "clusterd-0.1.0-py3-none-any.whl").write_bytes(b"PK planted")
    (forged / "requirements.txt").write_text("planted\n")
    message = refusal(place / "wheelhouse")
    assert f"{forged} has no SHA256SUMS: it is not a wheelhouse clusterd built" in message


@pytest.mark.anyio
async def test_a_file_changed_after_the_build_is_refused_before_it_is_sent(
        place: Path, built: Wheelhouse, node: Path) -> None:
    """Found again, the whole wheelhouse is hashed. Before an install, what the nodes are
    sent is: the archive to a node of the daemon's kind (any other gets a wheelhouse of its
    own, checked the same way)."""
    root = copy_of(built, place)
    builder = WheelhouseBuilder(root)
    wheelhouse = await builder.ensure()  # as the daemon found it, before the change
    wheel = next(wheelhouse.path.glob("anyio-*.whl"))
    spoil(wheel)
    assert f"{wheel} has changed since the wheelhouse was built" in refusal(root)
    wheelhouse.verify([venv_archive.ZSTD_ARCHIVE])  # the archive is the one recorded
    with pytest.raises(WheelhouseRefused) as refused:
        wheelhouse.verify()
    assert f"{wheel} has changed since" in refused.value.message
    # A daemon holding it from before: a changed archive is not sent to the node.
    archive = wheelhouse.path / venv_archive.ZSTD_ARCHIVE
    spoil(archive)
    with pytest.raises(WheelhouseRefused) as refused:
        await install_runtime(LocalRunner(), builder)
    assert f"{archive} has changed since" in refused.value.message
    assert list(node.iterdir()) == []


def test_a_partial_copy_or_a_planted_file_is_refused(place: Path, built: Wheelhouse) -> None:
    root = copy_of(built, place)
    key_dir = root / built.key
    (key_dir / "zz_planted-1.0-py3-none-any.whl").write_bytes(b"PK")
    assert "zz_planted-1.0-py3-none-any.whl is not among the files recorded" in refusal(root)
    (key_dir / "zz_planted-1.0-py3-none-any.whl").unlink()
    next(key_dir.glob("structlog-*.whl")).unlink()
    assert "was recorded when the wheelhouse was built and is missing" in refusal(root)


def test_its_records_are_what_sha256sum_and_the_test_beds_image_read(
        place: Path, built: Wheelhouse) -> None:
    """The EC2 test bed's runtime image installs by hand (no clusterd there): with coreutils'
    sha256sum over SHA256SUMS, and pip over requirements-hashed.txt."""
    checked = subprocess.run(["sha256sum", "--check", "--strict", "--quiet", SUMS],
                             cwd=built.path, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert (built.path / HASHED_REQUIREMENTS).read_text() == built.require_hashes()
    assert "--hash=sha256:" in built.require_hashes([built.package_wheel])
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from _testbed.common import Failure
    from _testbed.ec2 import runtime_image

    assert runtime_image.find_wheelhouse(str(built.path.parent)) == str(built.path)
    root = copy_of(built, place)
    (root / built.key).chmod(0o777)
    with pytest.raises(Failure, match="refusing the wheelhouse"):
        runtime_image.find_wheelhouse(str(root))


def appended(name: str, archive: bytes) -> bytes:
    """Bytes added after the archive's end."""
    return archive + b"\0planted"


def replanted(name: str, archive: bytes) -> bytes:
    """A well-formed archive of the same runtime whose one module gains a line."""
    zstd = name == venv_archive.ZSTD_ARCHIVE
    tar_bytes = (zstandard.ZstdDecompressor().decompressobj().decompress(archive) if zstd
                 else gzip.decompress(archive))
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as old, \
            tarfile.open(fileobj=out, mode="w") as new:
        for member in old.getmembers():
            data = old.extractfile(member) if member.isfile() else None
            if data is not None and member.name.endswith("/anyio/__init__.py"):
                body = data.read() + b"\nPLANTED = True\n"
                member.size = len(body)
                new.addfile(member, io.BytesIO(body))
            else:
                new.addfile(member, data)
    return (zstandard.ZstdCompressor().compress(out.getvalue()) if zstd
            else gzip.compress(out.getvalue()))


class TamperingLink(LocalRunner):
    """A node reached through something that changes the runtime's archive on its way."""

    def __init__(self, change: Callable[[str, bytes], bytes], scratch: Path) -> None:
        super().__init__()
        self.change = change
        self.scratch = scratch

    async def run(self, argv: Sequence[str], *, input: bytes | Path | None = None,
                  timeout_s: float = 120) -> CommandResult:
        if isinstance(input, Path):
            changed = self.scratch / input.name
            changed.write_bytes(self.change(input.name, input.read_bytes()))
            input = changed
        return await super().run(argv, input=input, timeout_s=timeout_s)


@pytest.mark.ray  # unpacks Ray into a venv: slow
@pytest.mark.parametrize("change", [appended, replanted])
@pytest.mark.anyio
async def test_the_node_keeps_nothing_of_a_runtime_changed_on_the_way(
        built: Wheelhouse, node: Path, tmp_path: Path, change: Callable[[str, bytes], bytes]
) -> None:
    """The node unpacks the archive as it arrives, but keeps it only if what arrived is what
    was recorded at the build, whether or not tar could unpack it: nothing is left to run,
    and no marker says the runtime is there."""
    with pytest.raises(ProtocolError) as refused:
        await install_runtime(TamperingLink(change, tmp_path), WheelhouseBuilder(built.path.parent))
    message = refused.value.message
    assert "does not match the digest recorded when the wheelhouse was built" in message
    assert message.endswith(f"nothing of it was kept: {venv_archive.ZSTD_ARCHIVE}")
    assert not (node / ".clusterd" / "venvs" / built.key).exists()
    assert not (node / ".clusterd" / "current").exists()


def without_zstd(place: Path) -> dict[str, str]:
    """An environment whose PATH has what a node needs (python3, tar, gzip, sh...), not zstd."""
    bin_dir = place / "bin-without-zstd"
    bin_dir.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        for tool in Path(directory).glob("*") if Path(directory).is_dir() else []:
            target = bin_dir / tool.name
            if tool.name != "zstd" and not target.exists() and os.access(tool, os.X_OK):
                target.symlink_to(tool)
    return {**os.environ, "PATH": str(bin_dir)}


@pytest.mark.ray  # installs Ray into a venv: slow
@pytest.mark.parametrize("zstd", [True, False], ids=["zstd", "gzip"])
@pytest.mark.anyio
async def test_a_node_installs_the_runtime_from_a_good_wheelhouse(
        built: Wheelhouse, node: Path, tmp_path: Path, zstd: bool,
        capfd: pytest.CaptureFixture[str]) -> None:
    """On a node with zstd the runtime comes as .tar.zst; on one without, as .tar.gz."""
    assert shutil.which("zstd"), "scripts/test installs Debian's zstd"
    runner = LocalRunner(env=None if zstd else without_zstd(tmp_path))
    await install_runtime(runner, WheelhouseBuilder(built.path.parent))
    sent = venv_archive.ZSTD_ARCHIVE if zstd else venv_archive.GZIP_ARCHIVE
    assert f"archive={sent}" in capfd.readouterr().out  # the daemon's log line
    venv = node / ".clusterd" / "current"
    site_packages = next(node.glob(".clusterd/venvs/*/lib/python*/site-packages"))
    shipped = sorted(site_packages.rglob("*.pyc"))
    # The venv is the node's: its interpreter, its own prefix, none of the daemon's
    # packages. The first import runs the bytecode compiled with the wheelhouse, checked
    # against the node's sources (PEP 552 flags 0b11), and compiles nothing.
    done = await anyio.run_process(
        [str(venv / "bin" / "python"), "-c",
         "import sys, clusterd.node_shared.auth, ray, importlib.util as u; "
         "print(sys.prefix, sys.prefix != sys.base_prefix, ray.__file__); "
         "print(open(u.cache_from_source(ray.__file__), 'rb').read()[4])"], check=False)
    first, flags = done.stdout.decode().splitlines()
    prefix, isolated, ray_file = first.split()
    assert Path(prefix).resolve() == venv.resolve() and isolated == "True"
    assert Path(ray_file).resolve().is_relative_to(site_packages.resolve())
    assert flags == "3", done.stderr
    assert len(shipped) > 1000 and sorted(site_packages.rglob("*.pyc")) == shipped
    assert (venv / "bin" / "python").resolve() == Path(sys._base_executable).resolve()
    # Its console scripts run wherever the venv lies (relocatable: no path of the build's).
    ray_cli = await anyio.run_process([str(venv / "bin" / "ray"), "--version"], check=False)
    assert ray_cli.returncode == 0 and b"ray, version" in ray_cli.stdout, ray_cli.stderr
    # Streamed, not copied: nothing of the install is left beside the venv.
    assert sorted(p.name for p in (node / ".clusterd").iterdir()) == ["current", "venvs"]
    # Asked again, the node has it: linked to it (again), no probe. Told to install it
    # anyway (it answered with another version), it says what its Python is.
    (node / ".clusterd" / "current").unlink()
    assert await linked_or_probed(runner, built) is None
    assert os.readlink(node / ".clusterd" / "current") == f"venvs/{built.key}"
    probed = await linked_or_probed(runner, built, force=True)
    assert probed is not None and (probed.python, probed.has_zstd) == (PYTHON_TAG, zstd)
    assert probed.executable is not None and Path(probed.executable).is_file()


def test_the_runtime_archive_holds_nothing_of_this_machine(built: Wheelhouse) -> None:
    """Built once here and unpacked on every node: no owner, time or path of the build's, no
    link to this machine's interpreter, in a stable order; the same tar in both archives."""
    zstd = (built.path / venv_archive.ZSTD_ARCHIVE).read_bytes()
    tar_bytes = zstandard.ZstdDecompressor().decompressobj().decompress(zstd)
    assert gzip.decompress((built.path / venv_archive.GZIP_ARCHIVE).read_bytes()) == tar_bytes
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as archive:
        members = archive.getmembers()
    assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0, 0, "", "", 0)}
    names = {m.name for m in members}
    assert "pyvenv.cfg" not in names and not {n for n in names if n.startswith("bin/python")}
    links = [m for m in members if m.issym() or m.islnk()]
    assert not [m for m in links if m.linkname.startswith("/")], links
    assert [m.name for m in members] == sorted((m.name for m in members),
                                               key=lambda n: n.split("/"))


def test_rays_wheel_comes_without_what_no_node_runs(built: Wheelhouse) -> None:
    """Ray's wheel in the wheelhouse lacks the libraries and jars (slim.py), and is still a
    whole wheel: its RECORD names each file it holds with that file's digest, and nothing
    it lacks; its `serve` and `tune` commands are gone with them, `ray` stays."""
    wheel = next(built.path.glob("ray-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        # Ray's own, at the top (it vendors packages with dist-info dirs of their own).
        [record_name] = [n for n in names if n.endswith(".dist-info/RECORD") and
                         n.count("/") == 1]
        rows = list(csv.reader(io.StringIO(archive.read(record_name).decode())))
        for name, digest, _size in rows:
            if name != record_name:
                assert digest == slim._record_hash(archive.read(name)), name
        entry_points = archive.read(record_name.replace("RECORD", "entry_points.txt")).decode()
    assert {row[0] for row in rows} == names
    assert not [n for n in names if n.startswith(("ray/jars/", "ray/rllib/", "ray/data/",
                                                   "ray/dashboard/client/"))]
    assert "ray/_raylet.so" in names and "ray/dashboard/agent.py" in names
    assert "ray = " in entry_points and "serve =" not in entry_points
    assert wheel.stat().st_size < 50_000_000  # of 79 MB whole


def test_botocore_comes_with_only_the_service_models_a_node_loads(built: Wheelhouse,
                                                                  tmp_path: Path) -> None:
    """botocore's wheel keeps the models of S3 and of the services its credential providers
    call, and the files every service reads; and it still makes an S3 client and signs a
    request with them, from the slimmed wheel alone."""
    wheel = next(built.path.glob("botocore-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    services = {n.split("/")[2] for n in names
                if n.startswith("botocore/data/") and n.count("/") > 2}
    assert services == set(slim.BOTOCORE_SERVICES)
    assert {"botocore/data/endpoints.json", "botocore/data/_retry.json"} <= names
    assert wheel.stat().st_size < 3_000_000  # of 16 MB whole
    made = subprocess.run(
        [sys.executable, "-S", "-c",
         "import sys; sys.path[:0] = [sys.argv[1], *sys.argv[2:]]\n"
         "import botocore.session\n"
         "c = botocore.session.get_session().create_client('s3', region_name='eu-west-1',"
         " aws_access_key_id='k', aws_secret_access_key='s')\n"
         "print(botocore.__file__)\n"
         "print(c.generate_presigned_url('get_object', {'Bucket': 'b', 'Key': 'k'}))",
         str(tmp_path / "site"), *[p for p in sys.path if "site-packages" in p]],
        capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    module, url = made.stdout.split()
    assert module.startswith(str(tmp_path / "site"))  # the slimmed one, not the dev venv's
    assert url.startswith("https://") and "amazonaws.com/" in url and "Signature" in url, url


@pytest.mark.parametrize("niceness", [0, BEHIND_HEAD_NICENESS])
def test_a_workers_unpacking_yields_the_cpu_when_asked(tmp_path: Path, niceness: int) -> None:
    """The receive command, niced (a worker's install, behind the head's start), runs its
    tar at that niceness; not asked, at the node's own."""
    content = tmp_path / "content"
    (content / "bin").mkdir(parents=True)
    (content / "lib").mkdir()
    (content / "lib" / "module.py").write_text("x = 1\n")
    archive = tmp_path / "runtime.tar.gz"
    subprocess.run(["tar", "-czf", str(archive), "-C", str(content), "bin", "lib"], check=True)
    # tar, as the node runs it, says at which niceness it runs (`nice` prints it), then is tar.
    tools = tmp_path / "tools"
    tools.mkdir()
    said = tmp_path / "tar-niceness"
    real_tar = shutil.which("tar")
    (tools / "tar").write_text(f"#!/bin/sh\nnice > {said}\nexec {real_tar} \"$@\"\n")
    (tools / "tar").chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    (tmp_path / "old-venv").mkdir()
    (tmp_path / "current").symlink_to("old-venv")
    command = venv_archive.receive_command(venv_archive.GZIP_ARCHIVE, str(tmp_path / "venv"),
                                           digest, ".ready", niceness, "current", "venv")
    done = subprocess.run(command, input=archive.read_bytes(), env=env, capture_output=True,
                          check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    own = os.nice(0)
    assert int(said.read_text()) == own + niceness
    assert (tmp_path / "venv" / "lib" / "module.py").read_text() == "x = 1\n"
    assert (tmp_path / "venv" / ".ready").exists()
    # Made the current one, the link replaced (as `ln -sfn` would), nothing left beside it.
    assert os.readlink(tmp_path / "current") == "venv"
    assert not os.path.lexists(tmp_path / "current.new")
