-- The liveness sweep asks each second which ECMs are silent past their expiry. Without
-- an index that is a scan of every ECM, healthy or not: its cost grew with the fleet.
-- An index on the last heartbeat itself would be rewritten by every beat (no more
-- heap-only updates of the ecm row, an index entry per beat in each of its indexes), so
-- the index is on `beat_mark`, a heartbeat time at most BEAT_MARK_SLACK older than the
-- last one, renewed by one beat in several (rm_server/store/heartbeats.py). The sweep
-- (rm_server/store/ecms.py EXPIRED_ECMS_SQL) reads through it only the ECMs whose mark is
-- overdue, and checks their exact last heartbeat.
ALTER TABLE ecm ADD COLUMN beat_mark timestamptz;
UPDATE ecm SET beat_mark = last_heartbeat_at;
CREATE INDEX ecm_silent_since ON ecm ((coalesce(beat_mark, registered_at)))
    WHERE state <> 'LOST';

-- List pages in keyset order with a filter: each filter has an index in the page's own
-- order, so a page reads its rows and no more, the last page as cheaply as the first.
-- A user's own tickets (ListTickets of every non-admin caller):
CREATE INDEX ticket_user ON ticket (user_name, ticket_id);
-- EngineConns by state and by ECM (ended ones are kept for the retention period):
CREATE INDEX engine_conn_state ON engine_conn (state, ec_id);
CREATE INDEX engine_conn_ecm ON engine_conn (ecm_instance, ec_id);
-- Demands by state, in the (user, demand id) order of their pages:
CREATE INDEX demand_state_page ON demand (state, user_name, demand_id);
-- Label records by source (the limit-backed ones among the ECMs' and vice versa):
CREATE INDEX label_resource_source ON label_resource (source, label);
