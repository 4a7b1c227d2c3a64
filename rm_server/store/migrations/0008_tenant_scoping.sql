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

-- Demand ids are chosen by clients, so they are per user: (user_name, demand_id) is the
-- key. Another user's demand of the same id is a different demand; GetDemand and the
-- others look only among the caller's own, and OrderBy names only the user's own.
ALTER TABLE demand_event ADD COLUMN user_name text;
UPDATE demand_event e SET user_name = d.user_name FROM demand d WHERE d.demand_id = e.demand_id;
ALTER TABLE demand_event
    ALTER COLUMN user_name SET NOT NULL,
    DROP CONSTRAINT demand_event_demand_id_fkey;
ALTER TABLE demand DROP CONSTRAINT demand_pkey, ADD PRIMARY KEY (user_name, demand_id);
DROP INDEX demand_user;  -- the primary key serves it now
ALTER TABLE demand_event ADD FOREIGN KEY (user_name, demand_id)
    REFERENCES demand (user_name, demand_id) ON DELETE CASCADE;
DROP INDEX demand_event_demand;
CREATE INDEX demand_event_demand ON demand_event (user_name, demand_id, id);
