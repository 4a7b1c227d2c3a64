"""EngineConn runtime (started as `python -m engineconn`); built by the EngineConn issue."""

__version__ = "0.1.0"
