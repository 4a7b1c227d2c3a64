-- Background jobs that need only one runner (the ticket sweep, the ECM and EngineConn
-- liveness sweep, the demand planner) run on the replica holding their lease; the
-- others take it over once it has not been renewed for its time to live.
CREATE TABLE background_lease (
    job         text PRIMARY KEY,
    holder      text NOT NULL,            -- the replica id of rm-server holding it
    expires_at  timestamptz NOT NULL
);
