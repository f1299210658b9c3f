-- What the patterns' installer (pgtask/patterns/__init__.py) reads and runs besides the patterns'
-- own sections: the catalog reads that decide each step (a relation: catalog.sql's "relation"),
-- the advisory lock that serialises the installers of one table (its key: "pgtask patterns
-- schema.table"), the look-up and update of a pattern's repeating task (found by its marker in
-- "data"; "live_tasks" also tells whether its repeat is the one wanted), and what uninstall stops
-- and drops. The sections carry no comments: their text is sent as is. %s are parameters;
-- {placeholders} are filled in with psycopg.sql (placeholders.py): {relation}, {column}, {type},
-- {trigger}, {signature} and {repeat} are the installer's own.

-- lock --
SELECT pg_advisory_xact_lock(hashtext(%s))

-- functions --
SELECT p.oid, pg_get_functiondef(p.oid) FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname = %s

-- signature --
SELECT %s::regprocedure::text

-- trigger --
SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s AND tgname = %s AND NOT tgisinternal

-- column_types --
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum

-- add_column --
ALTER TABLE {relation} ADD COLUMN {column} {type}

-- live_tasks --
SELECT "id", "state"::text, "input", "repeat" = {repeat}::interval FROM {table}
WHERE "data" = %s AND "state" IN ('PLAN', 'TAKE', 'WORK') ORDER BY "id"

-- update_planned --
UPDATE {table} SET "input" = %s, "repeat" = %s::interval
WHERE "id" = ANY(%s)

-- stop_tasks --
UPDATE {table} SET "state" = 'STOP'
WHERE "data" = %s AND "state" IN ('PLAN', 'WORK') RETURNING "id"

-- drop_trigger --
DROP TRIGGER {trigger} ON {table}

-- drop_function --
DROP FUNCTION {signature}

-- drop_index --
DROP INDEX {relation}

-- drop_column --
ALTER TABLE {table} DROP COLUMN {column}

-- drop_table --
DROP TABLE {relation} CASCADE
