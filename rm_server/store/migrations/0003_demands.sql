-- Time-aware demands (see docs/demands.md): the demands, their transition history, and the
-- capacity reserved for them on labels while they are ALLOCATING.

-- Capacity held for ALLOCATING demands, counted as in use by every apply except the
-- demand's own (which hands its reservation over to its ticket in one transaction).
-- NULL: nothing reserved. Always the sum of the reservations of the ALLOCATING demands
-- that list this label in demand.reserved_labels.
ALTER TABLE label_resource ADD COLUMN reserved jsonb;

CREATE TABLE demand (
    demand_id        text PRIMARY KEY,            -- client-chosen; the idempotency key
    definition_hash  bytea NOT NULL,              -- user, labels, resource, conditions
    state            text NOT NULL CHECK (state IN
                         ('NEW', 'ACCEPTED', 'ALLOCATING', 'ALLOCATED', 'MONITORING',
                          'FINISHED', 'FAILED')),
    reason           text NOT NULL DEFAULT '',    -- of the last transition
    user_name        text NOT NULL,
    labels           jsonb NOT NULL,              -- [[key, value], ...] as submitted
    charged_labels   text[] NOT NULL,             -- resource-carrying labels, canonical order
    resource         jsonb NOT NULL,
    conditions       jsonb NOT NULL,              -- canonical JSON, unresolved (NOW, +5m)
    order_by_ids     text[] NOT NULL DEFAULT '{}',-- every id named in OrderBy
    submitted_at     timestamptz NOT NULL,        -- NOW of the conditions
    planned_start    timestamptz NOT NULL,        -- where the plan put its allocation
    plan_start       timestamptz NOT NULL,        -- its occupation of the plan
    plan_end         timestamptz,                 -- NULL: unbounded
    slip_seconds     double precision NOT NULL DEFAULT 0,
    rounds           integer NOT NULL DEFAULT 0,  -- passed-over scheduling rounds
    closed_at        timestamptz,                 -- a loose window closed: slipping since
    reserved_labels  text[] NOT NULL DEFAULT '{}',-- where its reservation was added
    ticket_id        text,
    allocated_at     timestamptz,
    claim_expires_at timestamptz,
    claimed_at       timestamptz,
    ended_at         timestamptz,
    overruns         text[] NOT NULL DEFAULT '{}',
    next_check_at    timestamptz,                 -- NULL once FINISHED or FAILED
    updated_at       timestamptz NOT NULL
);
-- The planner's queue: due demands, claimed with FOR UPDATE SKIP LOCKED.
CREATE INDEX demand_due ON demand (next_check_at) WHERE next_check_at IS NOT NULL;
CREATE INDEX demand_user ON demand (user_name, demand_id);
CREATE INDEX demand_state ON demand (state, demand_id);
-- Admission reads the active demands on a label; cycle checks follow OrderBy edges.
CREATE INDEX demand_charged_labels ON demand USING gin (charged_labels)
    WHERE state IN ('ACCEPTED', 'ALLOCATING', 'ALLOCATED', 'MONITORING');
CREATE INDEX demand_ticket ON demand (ticket_id) WHERE ticket_id IS NOT NULL;

-- Every transition with its time and reason; a note (an overrun, a passed-over round
-- that closed a ^N window, a re-plan) has from_state = to_state.
CREATE TABLE demand_event (
    id          bigserial PRIMARY KEY,
    demand_id   text NOT NULL REFERENCES demand (demand_id) ON DELETE CASCADE,
    from_state  text,                             -- NULL: created
    to_state    text NOT NULL,
    at          timestamptz NOT NULL,
    reason      text NOT NULL
);
CREATE INDEX demand_event_demand ON demand_event (demand_id, id);
