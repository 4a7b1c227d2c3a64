"""The only package that speaks SQL. Every mutating operation is one transaction
that locks label rows first (sorted by label text), then ticket rows (sorted by id)."""

from rm_server.store.db import Database, Replay
from rm_server.store.notify import LabelNotifier

__all__ = ["Database", "LabelNotifier", "Replay"]
