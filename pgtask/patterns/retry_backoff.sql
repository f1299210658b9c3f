-- Retry with exponential backoff (the manual's "Retry with exponential backoff").
-- A FAILed task with retry < retry_max is cloned: parent = the failed attempt, retry + 1, and
-- plan = the failure time + retry_interval * 2^retry (1, 2, 4, ... times the interval).
-- Sections are "-- kind name --"; placeholders are filled in by pgtask/patterns/__init__.py.

-- column retry --
ALTER TABLE {table} ADD COLUMN "retry" integer NOT NULL DEFAULT 0

-- column retry_max --
ALTER TABLE {table} ADD COLUMN "retry_max" integer NOT NULL DEFAULT 0

-- column retry_interval --
ALTER TABLE {table} ADD COLUMN "retry_interval" interval NOT NULL DEFAULT '1 min'

-- function retry_backoff --
-- The clone copies every column (your own ones too) except those the scheduler fills in itself.
-- (Named <table>_retry_backoff: <table>_retry is the retry verb, docs/operations.md.)
CREATE OR REPLACE FUNCTION {fn_retry_backoff}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    columns text;
BEGIN
    IF NEW."retry" >= NEW."retry_max" THEN
        RETURN NULL;
    END IF;
    SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO columns
    FROM pg_attribute
    WHERE attrelid = TG_RELID AND attnum > 0 AND NOT attisdropped
      AND attname NOT IN ('id', 'plan', 'parent', 'start', 'stop', 'pid', 'state', 'error', 'output',
                          'attempt', 'lease', 'retry');
    EXECUTE format(
        'INSERT INTO %I.%I ("parent", "plan", "retry", %s) '
        'SELECT "id", statement_timestamp() + "retry_interval" * power(2, "retry"), "retry" + 1, %s '
        'FROM %I.%I WHERE "id" = $1',
        TG_TABLE_SCHEMA, TG_TABLE_NAME, columns, columns, TG_TABLE_SCHEMA, TG_TABLE_NAME) USING NEW."id";
    RETURN NULL;
END
$body$

-- trigger retry --
CREATE TRIGGER {name_retry} AFTER UPDATE OF "state" ON {table} FOR EACH ROW
WHEN (NEW."state" = 'FAIL' AND OLD."state" IS DISTINCT FROM NEW."state") EXECUTE FUNCTION {fn_retry_backoff}()
