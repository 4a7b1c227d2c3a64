-- Usage accounting: an hourly ledger of who used what, kept after retention deletes the
-- history it was rolled up from (docs/operations.md, "Usage and show-back").
--
-- One row per hour, user, userCreator, engineType and label. `label` is one of the
-- tickets' charged labels (an ECM's, a limit's, a YARN queue's), or '' for the row that
-- counts each ticket once (a ticket charged to three labels appears in three label rows
-- and in one '' row: per-user and per-engine totals read the '' rows only).
-- Every amount is an exact integer "times microseconds": resource-seconds x 1e6.

CREATE TABLE usage_hour (
    hour           timestamptz NOT NULL,           -- the hour's start (UTC)
    user_name      text NOT NULL,
    user_creator   text NOT NULL,                  -- '' when the request had none
    engine_type    text NOT NULL,                  -- ''
    label          text NOT NULL,                  -- a charged label; '': all of them
    tickets        bigint NOT NULL DEFAULT 0,      -- tickets that started in the hour
    -- granted (locked, then used once reported) per dimension: quantity x microseconds
    granted        jsonb NOT NULL DEFAULT '{}',
    -- measured by the EngineConns' agents (cgroups): memory byte x microseconds (the
    -- integral of the samples), CPU microseconds; and what those same tickets were
    -- granted, the efficiency's denominator (only measured tickets count there)
    measured_memory      numeric NOT NULL DEFAULT 0,
    measured_cpu         numeric NOT NULL DEFAULT 0,
    measured_granted_memory numeric NOT NULL DEFAULT 0,  -- memory_bytes x microseconds
    measured_granted_cpu    numeric NOT NULL DEFAULT 0,  -- cpu_millis x microseconds
    engine_conns   bigint NOT NULL DEFAULT 0,      -- EngineConns that started in the hour
    engine_conns_failed bigint NOT NULL DEFAULT 0, -- ... and ended FAILED or LOST
    engine_conn_time numeric NOT NULL DEFAULT 0,   -- their life in the hour, microseconds
    demands_planned   bigint NOT NULL DEFAULT 0,   -- demands accepted into the plan
    demands_allocated bigint NOT NULL DEFAULT 0,
    demands_failed    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, user_name, user_creator, engine_type, label)
);
CREATE INDEX usage_hour_user ON usage_hour (user_name, hour);

-- Adds two {dimension: amount} maps (missing dimensions count as 0).
CREATE FUNCTION usage_add(a jsonb, b jsonb) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_object_agg(k, coalesce((a ->> k)::numeric, 0)
                                        + coalesce((b ->> k)::numeric, 0)), '{}'::jsonb)
    FROM (SELECT jsonb_object_keys(a) UNION SELECT jsonb_object_keys(b)) AS keys (k)
$$;
CREATE AGGREGATE usage_sum(jsonb) (SFUNC = usage_add, STYPE = jsonb, INITCOND = '{}');

-- The roll-up reads what was written since its watermark, by the id of the transaction
-- that wrote it. Transaction ids below the oldest one still running
-- (pg_snapshot_xmin) belong to transactions that ended: no row with such an id can
-- appear later, so a watermark below that horizon never skips a row committed late
-- (timestamps and sequences do not have that property: a row can commit after a later
-- one). Existing rows get the migration's id and are rolled up by the first pass.
ALTER TABLE ticket_history ADD COLUMN xid bigint NOT NULL DEFAULT (pg_current_xact_id()::text::bigint);
CREATE INDEX ticket_history_xid ON ticket_history (xid);
ALTER TABLE engine_conn_event ADD COLUMN xid bigint NOT NULL DEFAULT (pg_current_xact_id()::text::bigint);
CREATE INDEX engine_conn_event_end_xid ON engine_conn_event (xid)
    WHERE state IN ('SUCCEEDED', 'FAILED', 'LOST');
ALTER TABLE demand_event ADD COLUMN xid bigint NOT NULL DEFAULT (pg_current_xact_id()::text::bigint);
CREATE INDEX demand_event_usage_xid ON demand_event (xid)
    WHERE to_state IN ('ACCEPTED', 'ALLOCATED', 'FAILED') AND from_state IS DISTINCT FROM to_state;

-- Per source ('tickets', 'engine_conns', 'demands'): every row written by a transaction
-- below `xid` is in the ledger. Moved in the transaction that adds those rows to
-- usage_hour, under this row's lock: a second replica's pass waits, then starts where
-- the first ended. `rolled_at`: when (the RM's clock) the last pass ended; retention
-- deletes no history ended after it (less a margin) until the ledger has it.
CREATE TABLE usage_watermark (
    source     text PRIMARY KEY,
    xid        bigint NOT NULL,
    rolled_at  timestamptz
);
INSERT INTO usage_watermark (source, xid) VALUES ('tickets', 0), ('engine_conns', 0), ('demands', 0);

-- An EngineConn's memory samples integrated (byte x microseconds): each heartbeat adds
-- the previous sample held until this one.
ALTER TABLE engine_conn ADD COLUMN measured_memory numeric NOT NULL DEFAULT 0;
ALTER TABLE ticket_history ADD COLUMN measured_memory numeric;  -- its EngineConn's, when ended
