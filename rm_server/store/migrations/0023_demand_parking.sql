-- Parked demands (docs/demands.md, "How the RM plans and allocates"). A demand that waits
-- for something other than the time (an ALLOCATING one refused for lack of room, an
-- ACCEPTED one waiting for the demands its OrderBy names) is parked: it gets no round
-- until that changes (its labels' room, a predecessor's end) or an instant its decision
-- depends on comes (its window, ^N, the OrderBy bound): next_check_at is that instant.
-- Rewriting every blocked demand's row in every pass made a pass cost as much as the
-- blocked demands, and, next_check_at being indexed, each of those UPDATEs wrote every
-- index of the row. While parked, its passed-over rounds count on with the time
-- (rounds + the rounds since parked_at) and its occupation of the plan starts now: the
-- plan's reads (rm_server/store/demands.py plan_entries) compute it from these columns.
ALTER TABLE demand
    ADD COLUMN parked_at timestamptz,             -- the start of the pass that parked it
    ADD COLUMN park_hold_seconds double precision, -- its planned hold; NULL: until its DeadLine
    ADD COLUMN park_deadline timestamptz;         -- its DeadLine (the hold's end, while ahead)

-- The planner counts and lists the blocked parked demands it must know (cheap: only they).
CREATE INDEX demand_parked ON demand (user_name, demand_id)
    WHERE parked_at IS NOT NULL AND state = 'ALLOCATING';
-- A demand's end wakes the ACCEPTED demands whose OrderBy names it.
CREATE INDEX demand_order_by ON demand USING gin (order_by_ids) WITH (fastupdate = off)
    WHERE state = 'ACCEPTED';
