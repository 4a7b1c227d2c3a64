-- A ticket charged for an EngineConn belongs to its lifecycle (the agent reports it,
-- KillEngineConn and the EngineConn's exit release it), never to a user's ReportUsed
-- or Release.
ALTER TABLE ticket ADD COLUMN engine_conn_id text;
UPDATE ticket t SET engine_conn_id = e.ec_id FROM engine_conn e WHERE e.ticket_id = t.ticket_id;

-- Waiting applies: what each waits for and since when it holds capacity back
-- (docs/architecture.md, "Waiting applies and fairness"), and the replica that serves
-- it: a waiter counts only while that replica holds its session advisory lock.
ALTER TABLE apply_waiter
    ADD COLUMN user_name  text NOT NULL DEFAULT '',
    ADD COLUMN resource   jsonb,
    ADD COLUMN replica_id text NOT NULL DEFAULT '',
    ADD COLUMN hold_until timestamptz;

CREATE TABLE rm_replica (
    replica_id  text PRIMARY KEY,
    lock_key    bigint NOT NULL UNIQUE,   -- pg_advisory_lock key held by its session
    host        text NOT NULL,
    pid         integer NOT NULL,
    started_at  timestamptz NOT NULL
);
