-- OpenTelemetry trace propagation columns: a task inserted with a trace_id, or by/under a parent
-- that has one, gets that trace_id and a fresh span_id. No pgcrypto: ids come from core
-- PostgreSQL's gen_random_uuid() (13+, the same strong random source), hashed to hex.

-- column trace_id --
ALTER TABLE {table} ADD COLUMN "trace_id" text

-- column span_id --
ALTER TABLE {table} ADD COLUMN "span_id" text

-- function trace_new_id --
-- A new W3C trace-id: 32 lowercase hex digits (16 bytes).
CREATE OR REPLACE FUNCTION {fn_trace_new_id}() RETURNS text LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp AS $body$
SELECT md5(gen_random_uuid()::text)
$body$

-- function trace_insert --
CREATE OR REPLACE FUNCTION {fn_trace_insert}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    IF NEW."parent" IS NOT NULL AND NEW."trace_id" IS NULL THEN
        SELECT "trace_id" INTO NEW."trace_id" FROM {table} WHERE "id" = NEW."parent";
    END IF;
    IF NEW."trace_id" IS NOT NULL THEN
        NEW."span_id" := left(md5(gen_random_uuid()::text), 16);  -- W3C span-id: 16 hex digits
    END IF;
    RETURN NEW;
END
$body$

-- trigger trace_insert --
CREATE TRIGGER {name_trace_insert} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {fn_trace_insert}()

-- query spans --
-- Each traced task as a span: its parent span is the parent task's span.
SELECT t."id", t."trace_id", t."span_id", p."span_id" AS "parent_span_id", t."state", t."start", t."stop",
       '00-' || t."trace_id" || '-' || t."span_id" || '-01' AS "traceparent"
FROM {table} t LEFT JOIN {table} p ON p."id" = t."parent"
WHERE t."trace_id" = %(trace_id)s
ORDER BY t."id"
