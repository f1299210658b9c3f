-- The notebooks' helpers (pgtask/patterns/notebook.py): whether a scheduler serves the table (its
-- application_name starts with the prefix given), rows of the task table ({columns} and {where}:
-- the notebook's SQL), a demo's reset of the rows it left (its marker in "data": planned ones
-- STOPped, running ones waited for, all deleted), and the finished tasks' source with the archive
-- (whether the archive pattern's partitioned table is there; the union of the columns both have).
-- %s are parameters; {placeholders} are filled in with psycopg.sql (placeholders.py).

-- serving --
SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND left(application_name, %s) = %s

-- tasks --
SELECT {columns} FROM {table} WHERE {where}

-- tasks_ordered --
{@tasks} ORDER BY "id"

-- demo_stop --
UPDATE {table} SET "state" = 'STOP' WHERE "data" = %s AND "state"::text IN ('PLAN', 'WAIT')

-- demo_running --
SELECT 1 FROM {table} WHERE "data" = %s AND "state" IN ('TAKE', 'WORK')

-- demo_delete --
DELETE FROM {table} WHERE "data" = %s

-- archive_partitioned --
SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind = 'p'

-- with_archive --
(SELECT {columns} FROM {table} UNION ALL SELECT {columns} FROM {rel_archive}) AS finished
