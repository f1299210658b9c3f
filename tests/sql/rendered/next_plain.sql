PREPARE "pgtask_next_plain" AS -- "next" of a pass that claimed with "claim_plain": no group's token to wait for.
-- Seconds until the next planned row or the next token of a rate-limited group that spent its
-- tokens (NULL: none; such a group is looked at once more when its token comes, whether or not
-- its tasks wait for it) and whether due rows wait (blocked by max, a pause or a rate); the
-- settings' fingerprint (settings_mark); the table's oid now (see same_table); whether some group
-- is paused or rate-limited (the next pass claims with "claim" or "claim_plain"); then when this
-- backend last read the server's configuration (a reload: the sessions' error style is read again,
-- see Session.style) and the error style in force here (remote tasks' errors). The service reads
-- the columns in this order (queries.NextInfo, named alike).
SELECT least(extract(epoch FROM (SELECT min("plan") FROM "public"."task"
                                  WHERE "state" = 'PLAN' AND "plan" > statement_timestamp() AND isfinite("plan"))
                                 - statement_timestamp())::float8,
             -- (Part of next_plain.)
NULL::float8) AS next_in,
       (SELECT min("plan") FROM "public"."task" WHERE "state" = 'PLAN') <= statement_timestamp() AS due,
       (-- A fingerprint of the ALTER DATABASE / ALTER ROLE settings that reach a session of this database:
-- a session reads them once, when it starts, so when this moves the pooled sessions are retired
-- (SessionPool.settings_changed). One scan of a small catalog, read by statements that run anyway.
SELECT coalesce(sum(hashtext(s.setrole::text || ' ' || s.setdatabase::text || ' ' || s.setconfig::text)), 0)
FROM pg_catalog.pg_db_role_setting s
WHERE s.setdatabase IN (0, (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database()))) AS settings_mark, to_regclass('"public"."task"')::oid::int8 AS table_oid, -- (Part of claim_plain and next.) Some group is paused or rate-limited.
EXISTS (SELECT FROM "public"."task_group" g WHERE g."paused" OR g."rate" IS NOT NULL) AS limited,
       pg_conf_load_time() AS conf_loaded, current_setting('log_error_verbosity') AS error_verbosity,
       current_setting('log_min_error_statement') AS min_error_statement
