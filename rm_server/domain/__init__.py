"""Pure domain layer: resources, labels and limit rules (no I/O, no framework imports)."""
