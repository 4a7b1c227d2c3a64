"""The native load generator (bench/native/loadgen.cc): built on first use with Debian's
gRPC C++ packages (libgrpc++-dev, protobuf-compiler-grpc; .ci/run and `make bench-native`
install them), into build/native/<hash of its sources>/loadgen, reused while the sources
are unchanged."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.node_modules import PROTO_ROOT, ROOT

HERE = Path(__file__).resolve().parent
# The service it calls (its gRPC stubs are generated; the imports get messages only).
SERVICES = ("labelrm/v1/resource_manager.proto",)
_LOCAL_IMPORT = re.compile(r'^import "(labelrm/[^"]+\.proto)";', re.MULTILINE)


def _with_imports(roots: tuple[str, ...]) -> list[str]:
    """`roots` and every labelrm .proto they import, directly or not (a proto that gains
    an import is built without a second list to keep in step)."""
    found: list[str] = []
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name not in found:
            found.append(name)
            pending.extend(_LOCAL_IMPORT.findall((PROTO_ROOT / name).read_text()))
    return sorted(found)


PROTOS = _with_imports(SERVICES)
SOURCES = [HERE / "loadgen.cc", HERE / "health.proto", *(PROTO_ROOT / p for p in PROTOS)]
TOOLS = ("protoc", "grpc_cpp_plugin", "g++", "pkg-config")


class NativeUnavailable(Exception):
    """The C++ toolchain or gRPC's C++ packages are missing, or the build failed."""


def _run(cmd: list[str], cwd: Path) -> str:
    try:
        done = subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True, timeout=600)
    except subprocess.CalledProcessError as exc:
        raise NativeUnavailable(f"{cmd[0]} failed:\n{exc.stderr[-3000:]}") from exc
    return done.stdout


def loadgen_binary(build_root: Path | None = None) -> Path:
    """The path of the built load generator (building it if its sources changed)."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise NativeUnavailable(
            f"missing {', '.join(missing)}: apt-get install g++ pkg-config libgrpc++-dev"
            " protobuf-compiler-grpc"
        )
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    build_root = build_root or ROOT / "build" / "native"
    target = build_root / digest.hexdigest()[:16]
    binary = target / "loadgen"
    if binary.is_file():
        return binary
    build_root.mkdir(parents=True, exist_ok=True)
    # Build in a scratch directory and rename: an interrupted build leaves nothing behind.
    scratch = Path(tempfile.mkdtemp(prefix="build-", dir=build_root))
    try:
        scratch.chmod(0o755)  # mkdtemp's 0700 would hide the binary from other users
        _build(scratch)
        try:
            scratch.rename(target)
        except OSError:  # another run built it meanwhile
            shutil.rmtree(scratch, ignore_errors=True)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return binary


def _build(out: Path) -> None:
    plugin = shutil.which("grpc_cpp_plugin")
    for include, messages, services in (
        (PROTO_ROOT, PROTOS, list(SERVICES)),
        (HERE, ["health.proto"], ["health.proto"]),
    ):
        _run(["protoc", f"-I{include}", f"--cpp_out={out}", *messages], cwd=include)
        grpc_out = [f"--grpc_out={out}", f"--plugin=protoc-gen-grpc={plugin}"]
        _run(["protoc", f"-I{include}", *grpc_out, *services], cwd=include)
    cflags = _run(["pkg-config", "--cflags", "grpc++", "protobuf"], cwd=out).split()
    libs = _run(["pkg-config", "--libs", "grpc++", "protobuf"], cwd=out).split()
    sources = [HERE / "loadgen.cc", *sorted(out.rglob("*.pb.cc"))]
    # Two compilers at a time (the machines this runs on have two cores); the generated
    # code needs no optimisation worth its compile time.
    pending = list(sources)
    running: list[tuple[Path, subprocess.Popen[str]]] = []
    try:
        while pending or running:
            while pending and len(running) < 2:
                source = pending.pop(0)
                level = "-O2" if source.parent == HERE else "-O1"
                cmd = ["g++", "-std=c++17", level, f"-I{out}", *cflags, "-c", str(source)]
                cmd += ["-o", str(out / (source.name + ".o"))]
                proc = subprocess.Popen(cmd, cwd=out, stderr=subprocess.PIPE, text=True)
                running.append((source, proc))
            source, proc = running[0]
            _, err = proc.communicate(timeout=600)
            running.pop(0)
            if proc.returncode != 0:
                raise NativeUnavailable(f"g++ failed on {source.name}:\n{err[-3000:]}")
    finally:  # a failure or a timeout: no compiler is left running
        for _, other in running:
            other.kill()
            other.wait()
    objects = sorted(str(p) for p in out.glob("*.o"))
    _run(["g++", "-o", str(out / "loadgen"), *objects, *libs], cwd=out)
