-- Retry until success (the manual's "Retry until success"): a repeating task whose input ends by
-- setting its own repeat to 0. On success that UPDATE commits with the work and no next occurrence
-- is inserted; on failure it rolls back with the work and the task repeats. Installs nothing.

-- query input --
-- {work}: the real work (one or more statements); it must not swallow its own errors.
{work};
UPDATE {table} SET "repeat" = '0 sec' WHERE "id" = current_setting('pg_task.id')::bigint
