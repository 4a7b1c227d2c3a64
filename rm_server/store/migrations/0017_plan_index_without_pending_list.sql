-- Admission reads a label's plan through demand_charged_labels on every SubmitDemand,
-- while the planner rewrites the rows of blocked demands every round and a burst of
-- submissions inserts thousands. A GIN index with `fastupdate` (the default) appends
-- those entries to a pending list that every search must scan in full until a vacuum or
-- the list's size limit merges it: the plan read of a label with ten demands took
-- 15–20 ms during a burst of 10,000. Without the pending list each write puts its
-- entries in place (a charged label or two per demand) and a search reads only its key.
ALTER INDEX demand_charged_labels SET (fastupdate = off);
