"""labelrm: a label-based resource manager."""

import os

# gRPC's C core writes to stderr in a format of its own (`I1126 12:00:00.1 … file.cc:71]
# …`), at INFO even for routine notes (skipping its fork handlers while the embedded
# database's tools run). It reads GRPC_VERBOSITY once, when grpc is imported: so here,
# before any module of the daemons imports it. Unless the operator sets it, errors only,
# so that each daemon's stderr is in its own one format (docs/operations.md, "Logs").
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
