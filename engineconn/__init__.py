"""EngineConn runtime (started as `python -m engineconn`); built by the EngineConn issue."""
