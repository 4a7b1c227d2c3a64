"""labelrm: a label-based resource manager."""
