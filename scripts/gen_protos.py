"""Regenerate the Python code for protos/labelrm/v1 (run by `make protos`).

The generated modules live next to the .proto files so that the import path
`labelrm.v1.<name>_pb2` matches the protobuf package, and are checked in; CI
regenerates them and fails on any difference (`make protos-check`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PACKAGE_DIR = PROTO_ROOT / "labelrm" / "v1"


def main() -> int:
    for stale in PACKAGE_DIR.glob("*_pb2*.py*"):
        stale.unlink()
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PACKAGE_DIR.glob("*.proto"))
    well_known = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={PROTO_ROOT}",
        f"--pyi_out={PROTO_ROOT}",
        f"--grpc_python_out={PROTO_ROOT}",
        *protos,
    ]
    code = protoc.main(args)
    if code != 0:
        print("protoc failed", file=sys.stderr)
        return int(code)
    for package in (PROTO_ROOT / "labelrm", PACKAGE_DIR):
        init = package / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated protobuf package (see scripts/gen_protos.py)."""\n')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
