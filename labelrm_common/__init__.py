"""What rm-server, ecm-agent, the EngineConn runtime and the clients share.

Nothing here imports any of them: the CLI and the agent install and run without the
server, and the server builds on the same definitions (version, quantities, log format,
roles, the PKI and token file tools of `rmctl pki` / `rmctl token`, the conversion of
seconds to a protobuf Duration, and the settings loader of all three daemons).
"""
