-- labelrm core schema: label resource records, tickets, their history, limits,
-- request ids for idempotency, and waiters for FIFO apply queues.
-- Resources are stored as the domain's canonical JSON (Resource.to_dict()).

CREATE TABLE label_resource (
    label         text PRIMARY KEY,          -- canonical LabelKey text
    source        text NOT NULL CHECK (source IN ('ecm', 'limit')),
    kind          text NOT NULL,
    max_resource  jsonb,                     -- NULL: usage tracked, not checked
    protected     jsonb NOT NULL,
    used          jsonb NOT NULL,
    locked        jsonb NOT NULL,
    live_tickets  bigint NOT NULL DEFAULT 0 CHECK (live_tickets >= 0),
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL
);

CREATE TABLE ecm (
    instance      text PRIMARY KEY,
    label         text NOT NULL UNIQUE,
    labels        jsonb NOT NULL,            -- [[key, value], ...]
    total         jsonb NOT NULL,
    protected     jsonb NOT NULL,
    registered_at timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL
);

CREATE TABLE label_limit (
    pattern       text PRIMARY KEY,          -- canonical LabelPattern text
    key_names     text NOT NULL,             -- "userCreator,engineType": narrows the candidates
    max_resource  jsonb NOT NULL,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL
);
CREATE INDEX label_limit_key_names ON label_limit (key_names);

CREATE TABLE ticket (
    ticket_id      text PRIMARY KEY,
    state          text NOT NULL CHECK (state IN ('LOCKED', 'USED')),
    user_name      text NOT NULL,
    labels         jsonb NOT NULL,           -- the request's labels [[key, value], ...]
    charged_labels text[] NOT NULL,          -- canonical order
    requested      jsonb NOT NULL,
    locked         jsonb NOT NULL,
    used           jsonb NOT NULL,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    lock_expires_at timestamptz
);
CREATE INDEX ticket_lock_expiry ON ticket (lock_expires_at) WHERE state = 'LOCKED';
CREATE INDEX ticket_charged_labels ON ticket USING gin (charged_labels);

CREATE TABLE ticket_history (
    ticket_id      text PRIMARY KEY,
    final_state    text NOT NULL CHECK (final_state IN ('RELEASED', 'EXPIRED')),
    reason         text NOT NULL,
    user_name      text NOT NULL,
    labels         jsonb NOT NULL,
    charged_labels text[] NOT NULL,
    requested      jsonb NOT NULL,
    used           jsonb,                    -- NULL when it was never reported
    created_at     timestamptz NOT NULL,
    reported_at    timestamptz,
    ended_at       timestamptz NOT NULL
);
CREATE INDEX ticket_history_ended_at ON ticket_history (ended_at);

CREATE TABLE request_log (
    method        text NOT NULL,
    request_id    text NOT NULL,
    request_hash  bytea NOT NULL,
    status_code   integer,                   -- NULL while the first attempt is in flight
    response      bytea,
    created_at    timestamptz NOT NULL,
    PRIMARY KEY (method, request_id)
);
CREATE INDEX request_log_created_at ON request_log (created_at);

-- One row per (waiting apply, label): an apply may not overtake an earlier
-- waiter on any of its labels (FIFO per label).
CREATE TABLE apply_waiter (
    label         text NOT NULL,
    seq           bigint NOT NULL,
    waiter_id     text NOT NULL,
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (label, seq)
);
CREATE SEQUENCE apply_waiter_seq;
CREATE INDEX apply_waiter_expires_at ON apply_waiter (expires_at);
