-- Cron-like scheduling (the manual's SQL pattern): a row with a 5-field cron expression in "cron"
-- (min hour dom month dow) inserts its next occurrence when it reaches DONE or FAIL, with
-- plan = the next matching minute after the finish. repeat stays 0. Times are in the TimeZone of
-- the session that finishes the task (the service's: the server's default).

-- function cron_field --
-- One field (*, a-b, */n, a-b/n, comma lists) -> the sorted array of matching values.
CREATE OR REPLACE FUNCTION {fn_cron_field}(spec text, lo integer, hi integer) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    part text; rng text; step integer; a integer; b integer; result integer[] := '{{}}';
BEGIN
    FOREACH part IN ARRAY string_to_array(spec, ',') LOOP
        IF part LIKE '%/%' THEN
            rng := split_part(part, '/', 1); step := split_part(part, '/', 2)::integer;
        ELSE
            rng := part; step := 1;
        END IF;
        IF step < 1 THEN RAISE EXCEPTION 'cron step must be positive: %', part; END IF;
        IF rng = '*' THEN a := lo; b := hi;
        ELSIF rng LIKE '%-%' THEN a := split_part(rng, '-', 1)::integer; b := split_part(rng, '-', 2)::integer;
        ELSE a := rng::integer; b := a;
        END IF;
        IF a < lo OR b > hi THEN RAISE EXCEPTION 'cron field value out of range [%,%]: %', lo, hi, part; END IF;
        SELECT result || array_agg(x) FROM generate_series(a, b, step) x INTO result;
    END LOOP;
    RETURN ARRAY(SELECT DISTINCT x FROM unnest(result) x WHERE x IS NOT NULL ORDER BY x);
END
$body$

-- function cron_next --
-- The first minute after from_ts matching the expression (vixie-cron: when both day-of-month and
-- day-of-week are restricted, a day matching either one matches).
CREATE OR REPLACE FUNCTION {fn_cron_next}(expr text, from_ts timestamptz DEFAULT now()) RETURNS timestamptz
LANGUAGE plpgsql STABLE STRICT SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    fields text[] := regexp_split_to_array(btrim(expr), '\s+');
    min_set integer[]; hour_set integer[]; dom_set integer[]; mon_set integer[]; dow_set integer[];
    dom_restricted boolean; dow_restricted boolean;
    d date; h integer; mi integer; day_ok boolean;
BEGIN
    IF array_length(fields, 1) IS DISTINCT FROM 5 THEN
        RAISE EXCEPTION 'cron expression must have 5 fields (min hour dom month dow): %', expr;
    END IF;
    min_set  := {fn_cron_field}(fields[1], 0, 59);
    hour_set := {fn_cron_field}(fields[2], 0, 23);
    dom_set  := {fn_cron_field}(fields[3], 1, 31);
    mon_set  := {fn_cron_field}(fields[4], 1, 12);
    dow_set  := {fn_cron_field}(fields[5], 0, 6);
    dom_restricted := fields[3] <> '*';
    dow_restricted := fields[5] <> '*';
    d := date_trunc('minute', from_ts)::date;
    FOR i IN 0 .. 1465 LOOP  -- about 4 years: enough for a Feb-29-only schedule
        day_ok := mon_set @> ARRAY[EXTRACT(month FROM d)::integer] AND (
            CASE WHEN dom_restricted AND dow_restricted
                 THEN dom_set @> ARRAY[EXTRACT(day FROM d)::integer] OR dow_set @> ARRAY[EXTRACT(dow FROM d)::integer]
                 ELSE dom_set @> ARRAY[EXTRACT(day FROM d)::integer] AND dow_set @> ARRAY[EXTRACT(dow FROM d)::integer]
            END);
        IF day_ok THEN
            FOREACH h IN ARRAY hour_set LOOP
                FOREACH mi IN ARRAY min_set LOOP
                    IF (d + h * interval '1 hour' + mi * interval '1 min')::timestamptz > from_ts THEN
                        RETURN d + h * interval '1 hour' + mi * interval '1 min';
                    END IF;
                END LOOP;
            END LOOP;
        END IF;
        d := d + 1;
    END LOOP;
    RAISE EXCEPTION 'no matching time found for cron expression % within search horizon', expr;
END
$body$

-- column cron --
ALTER TABLE {table} ADD COLUMN "cron" text

-- function cron_check --
-- A bad expression fails the INSERT (or UPDATE) instead of the task's finish much later.
CREATE OR REPLACE FUNCTION {fn_cron_check}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    PERFORM {fn_cron_next}(NEW."cron", statement_timestamp());
    RETURN NEW;
END
$body$

-- trigger cron_check --
CREATE TRIGGER {name_cron_check} BEFORE INSERT OR UPDATE OF "cron" ON {table} FOR EACH ROW
WHEN (NEW."cron" IS NOT NULL) EXECUTE FUNCTION {fn_cron_check}()

-- function cron --
CREATE OR REPLACE FUNCTION {fn_cron}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    columns text;
    next_plan timestamptz;
BEGIN
    next_plan := {fn_cron_next}(NEW."cron", statement_timestamp());
    SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO columns
    FROM pg_attribute
    WHERE attrelid = TG_RELID AND attnum > 0 AND NOT attisdropped
      AND attname NOT IN ('id', 'plan', 'parent', 'start', 'stop', 'pid', 'state', 'error', 'output',
                          'attempt', 'lease');
    EXECUTE format('INSERT INTO %I.%I ("parent", "plan", %s) SELECT "id", $2, %s FROM %I.%I WHERE "id" = $1',
                   TG_TABLE_SCHEMA, TG_TABLE_NAME, columns, columns, TG_TABLE_SCHEMA, TG_TABLE_NAME)
        USING NEW."id", next_plan;
    RETURN NULL;
END
$body$

-- trigger cron --
CREATE TRIGGER {name_cron} AFTER UPDATE OF "state" ON {table} FOR EACH ROW
WHEN (NEW."cron" IS NOT NULL AND NEW."state" IN ('DONE', 'FAIL') AND OLD."state" IS DISTINCT FROM NEW."state")
EXECUTE FUNCTION {fn_cron}()
