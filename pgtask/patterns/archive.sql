-- History/archive instead of a bare delete: every row deleted from the task table (the service's
-- auto-delete and your own cleanup alike) is copied into {rel_archive}, partitioned by "stop".
-- The primary key includes the partition key, so it is (id, stop). A row deleted before it ever
-- stopped is archived with stop = the time of its deletion (its start stays NULL).

-- table archive --
CREATE TABLE {rel_archive} (LIKE {table} INCLUDING DEFAULTS, PRIMARY KEY ("id", "stop"))
PARTITION BY RANGE ("stop")

-- table archive_default --
-- Rows with no dated partition land here (see the partition pattern for dated ones).
CREATE TABLE {rel_archive_default} PARTITION OF {rel_archive} DEFAULT

-- sync archive --
-- Columns added to the task table later (other patterns, your own) are added to the archive too.

-- function archive --
-- Copies the columns both tables have, so a column added to one and not yet to the other never
-- breaks the delete. An archive failure is a WARNING: it never takes the delete down with it.
CREATE OR REPLACE FUNCTION {fn_archive}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    columns text;
    selected text;
BEGIN
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum),
           string_agg(CASE WHEN a.attname = 'stop' THEN 'coalesce("stop", statement_timestamp())'
                           ELSE quote_ident(a.attname) END, ', ' ORDER BY a.attnum)
    INTO columns, selected
    FROM pg_attribute a JOIN pg_attribute b ON b.attname = a.attname
    WHERE a.attrelid = TG_RELID AND a.attnum > 0 AND NOT a.attisdropped
      AND b.attrelid = {q_archive}::regclass AND b.attnum > 0 AND NOT b.attisdropped;
    BEGIN
        EXECUTE format('INSERT INTO %s (%s) SELECT %s FROM (SELECT ($1).*) o', {q_archive}, columns, selected)
            USING OLD;
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING '%: failed to archive id = %: %', {q_archive}, OLD."id", SQLERRM;
    END;
    RETURN NULL;
END
$body$

-- trigger archive --
CREATE TRIGGER {name_archive} AFTER DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION {fn_archive}()
