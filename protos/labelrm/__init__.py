"""Generated protobuf package (see scripts/gen_protos.py)."""
