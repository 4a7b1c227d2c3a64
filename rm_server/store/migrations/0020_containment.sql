-- EngineConn containment: what each agent can enforce, what each EngineConn was granted
-- on its ECM (its cgroup's limits), and what its agent measured it using from its cgroup
-- (memory now and at its peak, CPU), kept on the EngineConn while it runs and on its
-- ticket's history row when it ends.

-- {"mode": "cgroup-v1" | "cgroup-v2" | "none", "controllers": [...], "cgroup_parents": [...]};
-- NULL: the agent did not say (an older agent).
ALTER TABLE ecm ADD COLUMN isolation jsonb;

ALTER TABLE engine_conn
    ADD COLUMN granted jsonb,                  -- Resource.to_dict(): its ticket's charge
    -- {"memory_bytes", "memory_peak_bytes", "cpu_millis", "cpu_time_micros"}
    ADD COLUMN measured jsonb,
    ADD COLUMN measured_at timestamptz;

ALTER TABLE ticket_history ADD COLUMN measured jsonb;
