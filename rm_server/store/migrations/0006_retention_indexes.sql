-- The retention sweep (rm_server/core.py) deletes EngineConns and demands that ended
-- long ago, oldest first; ticket_history already has its ended_at index.
CREATE INDEX engine_conn_ended_at ON engine_conn (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX demand_ended_at ON demand (ended_at) WHERE ended_at IS NOT NULL;
