-- Notifications on completion (the manual's NOTIFY variant): every DONE/FAIL sends a JSON payload
-- on a channel ({opt_channel}). LISTEN on it from any session of the database.

-- function notify --
-- NOTIFY payloads must stay under 8000 bytes: a long output/error is cut (and "truncated": true).
CREATE OR REPLACE FUNCTION {fn_notify}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    payload text;
BEGIN
    payload := json_build_object('id', NEW."id", 'group', NEW."group", 'state', NEW."state",
                                 'output', NEW."output", 'error', NEW."error")::text;
    IF octet_length(payload) > 7000 THEN
        payload := json_build_object('id', NEW."id", 'group', left(NEW."group", 200), 'state', NEW."state",
                                     'output', left(NEW."output", 500), 'error', left(NEW."error", 500),
                                     'truncated', true)::text;
    END IF;
    PERFORM pg_notify({opt_channel}, payload);
    RETURN NULL;
END
$body$

-- trigger notify --
CREATE TRIGGER {name_notify} AFTER UPDATE OF "state" ON {table} FOR EACH ROW
WHEN (NEW."state" IN ('DONE', 'FAIL') AND OLD."state" IS DISTINCT FROM NEW."state")
EXECUTE FUNCTION {fn_notify}()
