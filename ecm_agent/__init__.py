"""ECM agent daemon; built by the EngineConn issue."""
