-- External resource providers (Apache Linkis' linkis_cg_rm_external_resource_provider):
-- one row per external system, for example a YARN ResourceManager HA pair, serving
-- the requests that carry the cluster label `cluster=<cluster>`.
CREATE TABLE external_provider (
    name        text PRIMARY KEY,
    type        text NOT NULL CHECK (type IN ('yarn')),
    cluster     text NOT NULL UNIQUE,        -- value of the cluster label it serves
    config      jsonb NOT NULL,              -- addresses, auth, timeouts, cache TTL
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

-- A YARN queue's label record (`cluster=<c>,yarnQueue=<path>`): its locked resource is
-- what labelrm has granted on the queue and YARN does not show yet.
ALTER TABLE label_resource DROP CONSTRAINT label_resource_source_check;
ALTER TABLE label_resource ADD CONSTRAINT label_resource_source_check
    CHECK (source IN ('ecm', 'limit', 'external'));
