-- The bearer token each EngineConn's ExecutorService requires. Kept in clear (not hashed):
-- the RM must hand it back to the owner on GetEngineConn, and it is no more sensitive than
-- the EngineConn key the launch command already carries inside the RM's trust boundary.
-- '' for EngineConns created before this migration (they were launched without one).
ALTER TABLE engine_conn ADD COLUMN secret text NOT NULL DEFAULT '';
