"""The runtime's wheelhouse (runtime/install.py, runtime/wheelhouse.py) with real files, a
real second Linux user, a real pip and uv: a wheelhouse someone else could have written is
refused, so is one whose files are not the ones recorded at its build (on this machine before
the copy, and on the node before pip installs anything), and a key and a marker are not
enough to pass for one. One real wheelhouse is built for the module (the package index once,
about 15 s)."""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from clusterctl.protocol import ProtocolError
from clusterd.runtime import bytecode, slim
from clusterd.runtime.install import (
    Wheelhouse,
    WheelhouseBuilder,
    install_runtime,
    wheelhouse_key,
)
from clusterd.runtime.runner import LocalRunner
from clusterd.runtime.wheelhouse import HASHED_REQUIREMENTS, SUMS, WheelhouseRefused
from tests.support import other_user, short_tempdir


@pytest.fixture(scope="module")
def built() -> Iterator[Wheelhouse]:
    root = short_tempdir("cdwh-")
    try:
        yield WheelhouseBuilder(root / "wheelhouse").build()
    finally:
        shutil.rmtree(root, ignore_errors=True)


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
async def test_a_wheel_changed_after_the_build_is_refused_naming_it(
        place: Path, built: Wheelhouse, node: Path) -> None:
    root = copy_of(built, place)
    wheelhouse = WheelhouseBuilder(root).build()  # as the daemon found it, before the change
    wheel = next(wheelhouse.path.glob("anyio-*.whl"))
    spoil(wheel)
    assert f"{wheel} has changed since the wheelhouse was built" in refusal(root)
    # A daemon holding it from before: nothing is copied to the node.
    with pytest.raises(WheelhouseRefused) as refused:
        await install_runtime(LocalRunner(), wheelhouse)
    assert f"{wheel} has changed since" in refused.value.message
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


def rezip(wheel: Path) -> None:
    """Change a wheel so that it stays a well-formed zip: one module gains a line."""
    original = wheel.read_bytes()
    with zipfile.ZipFile(io.BytesIO(original)) as old, zipfile.ZipFile(wheel, "w") as new:
        for item in old.infolist():
            data = old.read(item.filename)
            if item.filename.endswith("/__init__.py"):
                data += b"\nPLANTED = True\n"
            new.writestr(item, data)


class TamperingNode(LocalRunner):
    """A node where someone changes a file of the wheelhouse (a wheel: `NAME-*.whl`) between
    the copy and the install."""

    def __init__(self, file: str, change: Callable[[Path], None] = spoil) -> None:
        super().__init__()
        self.file = file if file == bytecode.ARCHIVE else f"{file}-*.whl"
        self.change = change

    async def sync_dir(self, source: str, destination: str, *, timeout_s: float = 600) -> None:
        await super().sync_dir(source, destination, timeout_s=timeout_s)
        self.change(next(Path(os.path.expanduser(destination)).glob(self.file)))


# anyio: a wheel of the venv (bytes added: no zip any more; or a module changed inside a zip
# still well formed); uv: the installer itself, which would otherwise run as the node's user
# with whatever someone put in it.
@pytest.mark.parametrize(("wheel", "change"), [("anyio", spoil), ("anyio", rezip),
                                               ("uv", spoil)])
@pytest.mark.anyio
async def test_the_node_installs_nothing_from_a_wheel_changed_after_the_copy(
        built: Wheelhouse, node: Path, wheel: str, change: Callable[[Path], None]) -> None:
    with pytest.raises(ProtocolError) as refused:
        await install_runtime(TamperingNode(wheel, change), built)
    message = refused.value.message
    assert "do not match the digests recorded when the wheelhouse was built" in message
    assert f"{wheel}-" in message
    venv = node / ".clusterd" / "venvs" / built.key
    assert not list(venv.glob("lib/python*/site-packages/anyio*"))
    assert not list(venv.glob("lib/python*/site-packages/clusterd*"))
    if wheel == "uv":  # a changed installer is never unpacked (a checked one may be: it
        # is what refuses the other wheels, against the same digests)
        assert not list((node / ".clusterd" / "wheelhouse").glob("*.uv"))


@pytest.mark.ray  # installs Ray into a venv: slow
@pytest.mark.anyio
async def test_bytecode_changed_after_the_copy_leaves_the_runtime_unready(
        built: Wheelhouse, node: Path) -> None:
    """The bytecode is checked on the node too (uv checks only the wheels): changed, it is
    not unpacked, and the venv is not marked ready (the next launch installs it again)."""
    with pytest.raises(ProtocolError) as refused:
        await install_runtime(TamperingNode(bytecode.ARCHIVE), built)
    message = refused.value.message
    assert "do not match the digests recorded when the wheelhouse was built" in message
    assert message.endswith(f"not marked ready (nothing runs from it): {bytecode.ARCHIVE}")
    venv = node / ".clusterd" / "venvs" / built.key
    assert not list(venv.rglob("*.pyc")) and not list(venv.glob(".clusterd-ready"))


@pytest.mark.ray  # installs Ray into a venv: slow
@pytest.mark.anyio
async def test_a_node_installs_the_runtime_from_a_good_wheelhouse(built: Wheelhouse,
                                                                  node: Path) -> None:
    await install_runtime(LocalRunner(), built)
    python = node / ".clusterd" / "current" / "bin" / "python"
    site_packages = next(node.glob(".clusterd/venvs/*/lib/python*/site-packages"))
    shipped = sorted(site_packages.rglob("*.pyc"))
    # The first import runs the bytecode compiled with the wheelhouse, checked against the
    # node's sources (PEP 552 flags 0b11), and compiles nothing.
    done = await anyio.run_process(
        [str(python), "-c", "import clusterd.agent.auth, ray, importlib.util as u; "
         "print(open(u.cache_from_source(ray.__file__), 'rb').read()[4])"], check=False)
    assert done.stdout.decode().strip() == "3", done.stderr
    assert len(shipped) > 1000 and sorted(site_packages.rglob("*.pyc")) == shipped
    # Nothing of the install is left beside the wheelhouse copy but uv itself.
    leftovers = {p.name.split(built.key, 1)[1] for p in
                 (node / ".clusterd" / "wheelhouse").iterdir() if p.name != built.key}
    assert leftovers == {".require-hashes.txt", ".uv"}


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
