-- Conditional launch on a parent task (the manual's "on success" / "on failure").
-- A child whose parent has not settled waits in PLAN with plan = infinity; when the parent reaches
-- DONE or FAIL the child is released (plan = now, which also wakes the scheduler) or STOPped.

-- column depend --
ALTER TABLE {table} ADD COLUMN "depend" text NOT NULL DEFAULT 'always'
    CONSTRAINT {name_depend_check} CHECK ("depend" IN ('success', 'failure', 'always'))

-- function depend_insert --
CREATE OR REPLACE FUNCTION {fn_depend_insert}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    parent_state {state};
BEGIN
    IF NEW."parent" IS NULL THEN
        RETURN NEW;
    END IF;
    SELECT "state" INTO parent_state FROM {table} WHERE "id" = NEW."parent";
    IF parent_state IS NULL OR parent_state NOT IN ('DONE', 'FAIL') THEN
        NEW."plan" := 'infinity';                 -- parent has not settled yet: wait
    ELSIF NOT ((parent_state = 'DONE' AND NEW."depend" IN ('success', 'always'))
            OR (parent_state = 'FAIL' AND NEW."depend" IN ('failure', 'always'))) THEN
        NEW."state" := 'STOP';                     -- parent settled the other way: never run
    END IF;
    RETURN NEW;
END
$body$

-- trigger depend_insert --
CREATE TRIGGER {name_depend_insert} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {fn_depend_insert}()

-- function depend_update --
CREATE OR REPLACE FUNCTION {fn_depend_update}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    UPDATE {table} SET "plan" = statement_timestamp()
    WHERE "parent" = NEW."id" AND "state" = 'PLAN' AND "plan" = 'infinity'
      AND ((NEW."state" = 'DONE' AND "depend" IN ('success', 'always'))
        OR (NEW."state" = 'FAIL' AND "depend" IN ('failure', 'always')));
    UPDATE {table} SET "state" = 'STOP'
    WHERE "parent" = NEW."id" AND "state" = 'PLAN' AND "plan" = 'infinity'
      AND NOT ((NEW."state" = 'DONE' AND "depend" IN ('success', 'always'))
            OR (NEW."state" = 'FAIL' AND "depend" IN ('failure', 'always')));
    RETURN NULL;
END
$body$

-- trigger depend_update --
CREATE TRIGGER {name_depend_update} AFTER UPDATE OF "state" ON {table} FOR EACH ROW
WHEN (NEW."state" IN ('DONE', 'FAIL') AND OLD."state" IS DISTINCT FROM NEW."state")
EXECUTE FUNCTION {fn_depend_update}()
