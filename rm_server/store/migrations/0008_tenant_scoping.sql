-- Idempotency keys belong to their caller. A request id is only unique per (caller,
-- method): another caller's identical id is a different request, and a replay of a
-- stored outcome (an EngineConn with its executor secret included) goes to the caller
-- that made the request and to nobody else. `caller` is the authenticated principal
-- ("user:alice", "agent:agent1"; '' for the server's own calls and for dev mode).

ALTER TABLE request_log
    ADD COLUMN caller text NOT NULL DEFAULT '',
    DROP CONSTRAINT request_log_pkey,
    ADD PRIMARY KEY (caller, method, request_id);

-- CreateEngineConn / AskEngineConn: the EngineConn row is the request's outcome; the
-- hash of the request refuses the same id reused with a different body.
ALTER TABLE engine_conn
    DROP CONSTRAINT engine_conn_request_id_key,
    ADD COLUMN caller text NOT NULL DEFAULT '',
    ADD COLUMN request_method text NOT NULL DEFAULT '',
    ADD COLUMN request_hash bytea NOT NULL DEFAULT '',
    ADD CONSTRAINT engine_conn_request_key UNIQUE (caller, request_method, request_id);
