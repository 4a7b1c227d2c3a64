-- The liveness judge's shared state, one row whichever replica judges (store/liveness.py).
-- heard_since: silence counts from here on only; every replica moves it forward when it
-- begins to hear again (a start, a resume after a stall, its database back), the judge
-- when it takes over from another replica or a disruption ends. The rest is the judge's
-- last pass (judge: its replica id, NULL after a start), for GetClusterInfo and metrics.
CREATE TABLE liveness (
    id                  boolean PRIMARY KEY DEFAULT true CHECK (id),
    heard_since         timestamptz NOT NULL,
    heard_since_reason  text NOT NULL,
    judged_at           timestamptz,
    judge               text,
    disrupted_since     timestamptz,      -- NULL: no suspected disruption
    silent_agents       integer NOT NULL DEFAULT 0,
    agents              integer NOT NULL DEFAULT 0
);
