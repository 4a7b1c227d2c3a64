-- Every heartbeat group reads the launches its agents acknowledged (to notice an
-- EngineConn that vanished): without this index that is a scan of all acknowledged
-- commands of the last hour, per group.
CREATE INDEX agent_command_launch_done ON agent_command (agent_id, done_at)
    WHERE kind = 'launch' AND done_at IS NOT NULL;
