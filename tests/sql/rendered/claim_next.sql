PREPARE "pgtask_claim_next" AS -- Executor reuse within count/live (the manual's task_live): the next due task of the same group,
-- with max >= the max of the task that started this executor -- and of the same role: a session
-- is its author's (it logged in as that role, or passed that role's remote password rule).
WITH s AS (
    SELECT "id" FROM "public"."task" t
    WHERE "state" = 'PLAN' AND "plan" <= statement_timestamp() AND "group" = $3
      AND "remote" IS NOT DISTINCT FROM $4 AND "max" >= $6 AND "user" = $5
      AND -- (Part of claim, claim_next and reset.) The table the service knows (its oid) is the one of this
-- name now. A table dropped and provisioned again is another table, with other columns and another
-- channel: a service still holding the old oid neither claims nor resets its rows until it has
-- taken the new table up (see "next" and scheduler.Scheduler.adopt_table).
$2::oid = to_regclass('"public"."task"')
      AND ("plan" + least("active", interval '100000 years') > statement_timestamp()
           OR "repeat" > '0 sec' OR "max" < 0)
      AND CASE WHEN "count" > 0 AND "live" > '0 sec'
               THEN "count" > $7 AND $8::timestamptz + least("live", interval '100000 years') > statement_timestamp()
               ELSE "count" > $7 OR $8::timestamptz + least("live", interval '100000 years')
                    > statement_timestamp() END
      -- a paused or rate-limited group's tasks start through the claim (it keeps the count)
      AND NOT EXISTS (SELECT FROM "public"."task_group" g WHERE g."group" = $3 AND (g."paused" OR g."rate" IS NOT NULL))
    ORDER BY "max" DESC, "id" LIMIT 1
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE "public"."task" t SET "state" = 'TAKE', "attempt" = t."attempt" + 1, "lease" = -- (Part of claim and claim_next.) A claim's lease: the claiming instance's token (the first 18
-- characters of a uuid's text), then the rest of a fresh random uuid.
($1 || substr(gen_random_uuid()::text, 19))::uuid
FROM s WHERE t."id" = s."id"
RETURNING t."id", t."attempt", t."lease", t."group", t."remote", t."max", t."user",
    CASE WHEN octet_length(t."input") <= 65536 THEN t."input" END AS input,
    octet_length(t."input") AS input_bytes, t."repeat" > '0 sec' AS repeats,
    least(round(extract(epoch FROM t."timeout")) * 1000, 2147483647)::int4 AS timeout_ms, t."header", t."string", t."null",
    t."delimiter"::text AS delimiter, t."quote"::text AS quote, t."escape"::text AS escape, t."save",
    t."count", extract(epoch FROM t."live")::float8 AS live_s, t."delete", statement_timestamp() AS now,
    extract(epoch FROM statement_timestamp() - t."plan")::float8 AS waited, (-- A fingerprint of the ALTER DATABASE / ALTER ROLE settings that reach a session of this database:
-- a session reads them once, when it starts, so when this moves the pooled sessions are retired
-- (SessionPool.settings_changed). One scan of a small catalog, read by statements that run anyway.
SELECT coalesce(sum(hashtext(s.setrole::text || ' ' || s.setdatabase::text || ' ' || s.setconfig::text)), 0)
FROM pg_catalog.pg_db_role_setting s
WHERE s.setdatabase IN (0, (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database()))) AS settings_mark
