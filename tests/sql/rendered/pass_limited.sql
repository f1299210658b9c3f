BEGIN; EXECUTE pgtask_expire; -- Claims of all service instances on one table take turns (group counts stay exact): on the lock of
-- a table only the service may lock (see liveness.sql). The mode conflicts with itself, and with
-- nothing a role without privileges on that table can hold -- a statement another role PREPAREs
-- keeps at most ROW EXCLUSIVE. No transaction id, no WAL: an idle pass stays as cheap as it was.
LOCK TABLE "public"."task_claim" IN SHARE UPDATE EXCLUSIVE MODE; EXECUTE pgtask_claim('00000000-0000-0000', 0, 16, '{}', '{}'); EXECUTE pgtask_next; COMMIT
