-- State history of ECMs and EngineConns, for `rmctl describe` (the Events of `kubectl
-- describe`): one row per state an ECM or EngineConn entered, with the time the service
-- layer wrote (its injected clock: updated_at) and, for EngineConns, the recorded reason.
-- Written by triggers, so that every path that changes a state records it; deleted with
-- the ECM or EngineConn (retention, `rmctl node rm`).

CREATE TABLE ecm_event (
    instance  text NOT NULL REFERENCES ecm (instance) ON DELETE CASCADE,
    seq       bigserial,
    at        timestamptz NOT NULL,
    state     text NOT NULL,
    PRIMARY KEY (instance, seq)
);

CREATE TABLE engine_conn_event (
    ec_id     text NOT NULL REFERENCES engine_conn (ec_id) ON DELETE CASCADE,
    seq       bigserial,
    at        timestamptz NOT NULL,
    state     text NOT NULL,
    reason    text NOT NULL DEFAULT '',
    PRIMARY KEY (ec_id, seq)
);

CREATE FUNCTION ecm_record_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state THEN
        INSERT INTO ecm_event (instance, at, state) VALUES (NEW.instance, NEW.updated_at,
            CASE WHEN TG_OP = 'INSERT' THEN 'REGISTERED' ELSE NEW.state END);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER ecm_state_history AFTER INSERT OR UPDATE ON ecm
    FOR EACH ROW EXECUTE FUNCTION ecm_record_state();

CREATE FUNCTION engine_conn_record_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state THEN
        INSERT INTO engine_conn_event (ec_id, at, state, reason)
        VALUES (NEW.ec_id, NEW.updated_at, NEW.state, NEW.reason);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER engine_conn_state_history AFTER INSERT OR UPDATE ON engine_conn
    FOR EACH ROW EXECUTE FUNCTION engine_conn_record_state();
