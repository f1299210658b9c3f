-- Automatic partitioning via a repeating task: {fn_archive_partition}(lead) keeps monthly (UTC)
-- partitions of {rel_archive} stocked from the current month to the month of now() + lead, and a
-- repeating task calls it. Rows already sitting in the default partition for a new month are
-- moved into it, so creating a partition never fails on them. Requires the archive pattern.

-- function archive_partition --
-- Returns the partitions it created (with dry_run: the ones it would create).
CREATE OR REPLACE FUNCTION {fn_archive_partition}(lead interval DEFAULT '1 month', dry_run boolean DEFAULT false)
RETURNS SETOF text LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    month timestamp := date_trunc('month', now() AT TIME ZONE 'UTC');
    last timestamp := date_trunc('month', (now() + lead) AT TIME ZONE 'UTC');
    lo timestamptz;
    hi timestamptz;
    part text;
    columns text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext({q_archive}));  -- one creator at a time
    SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO columns
    FROM pg_attribute WHERE attrelid = {q_archive}::regclass AND attnum > 0 AND NOT attisdropped;
    WHILE month <= last LOOP
        part := {lit_archive} || '_' || to_char(month, 'YYYY_MM');
        lo := month AT TIME ZONE 'UTC';
        hi := (month + interval '1 month') AT TIME ZONE 'UTC';
        IF NOT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                       WHERE n.nspname = {schema_name} AND c.relname = part) THEN
            IF NOT dry_run THEN
                EXECUTE format('CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS)', {schema_name}, part, {q_archive});
                EXECUTE format('WITH moved AS (DELETE FROM %s WHERE "stop" >= %L AND "stop" < %L RETURNING %s) '
                               'INSERT INTO %I.%I (%s) SELECT %s FROM moved',
                               {q_archive_default}, lo, hi, columns, {schema_name}, part, columns, columns);
                EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
                               {q_archive}, {schema_name}, part, lo, hi);
            END IF;
            RETURN NEXT part;
        END IF;
        month := month + interval '1 month';
    END LOOP;
END
$body$

-- query archive_partition_input --
-- The input of the repeating task.
SELECT * FROM {fn_archive_partition}({opt_lead}::interval)

-- task archive_partition --
-- The repeating task, once: it runs as soon as it is inserted, then every {opt_repeat}.
INSERT INTO {table} ("plan", "repeat", "input", "data")
VALUES (statement_timestamp(), {opt_repeat}::interval, {input}, {marker})
