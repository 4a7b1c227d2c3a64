-- Nodes: a cordon (kubectl's): the ECM takes no new work while what runs there goes on,
-- through its agent's restarts and LOST spells, until uncordoned. And a node's history
-- outlives the node: its events stay after it leaves (decommissioned, `rmctl node rm`),
-- ending with a LEFT event, and go with the history retention like every ended row.

ALTER TABLE ecm
    ADD COLUMN cordoned boolean NOT NULL DEFAULT false,
    ADD COLUMN cordon_reason text NOT NULL DEFAULT '';

ALTER TABLE ecm_event DROP CONSTRAINT ecm_event_instance_fkey;
ALTER TABLE ecm_event ADD COLUMN reason text NOT NULL DEFAULT '';
CREATE INDEX ecm_event_at ON ecm_event (at);

CREATE OR REPLACE FUNCTION ecm_record_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO ecm_event (instance, at, state) VALUES (NEW.instance, NEW.updated_at,
            'REGISTERED');
        RETURN NULL;
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        INSERT INTO ecm_event (instance, at, state) VALUES (NEW.instance, NEW.updated_at,
            NEW.state);
    END IF;
    IF NEW.cordoned IS DISTINCT FROM OLD.cordoned THEN
        INSERT INTO ecm_event (instance, at, state, reason) VALUES (NEW.instance,
            NEW.updated_at, CASE WHEN NEW.cordoned THEN 'CORDONED' ELSE 'UNCORDONED' END,
            NEW.cordon_reason);
    END IF;
    RETURN NULL;
END $$;

-- The state an EngineConn was in when a kill was ordered (NULL: never killed). One rule
-- ends everything stopped on request (docs/architecture.md, "Ended on request"): it
-- FAILED when the stop cut work short (a BUSY EngineConn's execution, a STARTING one's
-- start), else it ends as it would have; a cancelled demand FAILED the same way.
ALTER TABLE engine_conn ADD COLUMN killed_from text;
