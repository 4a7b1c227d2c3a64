-- ECM liveness, node lists, EngineConns and the commands queued for agents.

ALTER TABLE ecm
    ADD COLUMN state text NOT NULL DEFAULT 'RUNNING'
        CHECK (state IN ('RUNNING', 'DRAINING', 'LOST')),
    ADD COLUMN last_heartbeat_at timestamptz,
    ADD COLUMN heartbeat_seq bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_response bytea;            -- answer to a resent heartbeat

-- Include / exclude lists (YARN's refreshNodes); entries are instances or hosts.
CREATE TABLE node_list (
    list   text NOT NULL CHECK (list IN ('include', 'exclude')),
    entry  text NOT NULL,
    PRIMARY KEY (list, entry)
);

CREATE TABLE engine_conn (
    ec_id           text PRIMARY KEY,
    request_id      text NOT NULL UNIQUE,      -- CreateEngineConn idempotency
    state           text NOT NULL CHECK (state IN
                        ('STARTING', 'IDLE', 'BUSY', 'SHUTTING_DOWN', 'SUCCEEDED',
                         'FAILED', 'LOST')),
    user_name       text NOT NULL,
    labels          jsonb NOT NULL,            -- [[key, value], ...] as requested
    label_set       text NOT NULL,             -- sorted "k=v,..." for reuse matching
    params          jsonb NOT NULL,
    engine          text NOT NULL,
    resource        jsonb NOT NULL,
    ecm_instance    text,
    ticket_id       text,
    address         text NOT NULL DEFAULT '',
    pid             integer,
    exit_code       integer,
    reason          text NOT NULL DEFAULT '',
    log_tail        text NOT NULL DEFAULT '',
    work_dir        text NOT NULL DEFAULT '',
    ecm_choices     jsonb NOT NULL DEFAULT '[]',
    launch_attempts integer NOT NULL DEFAULT 0,
    holder          text NOT NULL DEFAULT '',
    hold_expires_at timestamptz,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    launched_at     timestamptz,
    ready_at        timestamptz,
    last_report_at  timestamptz,
    ended_at        timestamptz
);
CREATE INDEX engine_conn_live_on_ecm ON engine_conn (ecm_instance)
    WHERE state IN ('STARTING', 'IDLE', 'BUSY', 'SHUTTING_DOWN');
CREATE INDEX engine_conn_reusable ON engine_conn (user_name, label_set) WHERE state = 'IDLE';
CREATE INDEX engine_conn_user ON engine_conn (user_name, ec_id);

CREATE TABLE agent_command (
    command_id  text PRIMARY KEY,
    agent_id    text NOT NULL,
    ec_id       text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('launch', 'kill', 'cleanup')),
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL,
    done_at     timestamptz
);
CREATE INDEX agent_command_pending ON agent_command (agent_id, created_at) WHERE done_at IS NULL;
