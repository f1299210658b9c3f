PREPARE "pgtask_expire" AS -- Due rows past plan + active become GONE (repeating and pausing rows never expire). Run at most
-- once per pg_task.sleep, not on every claim: it reads every due row; the claim skips expired rows.
-- "active" > 0 (a CHECK constraint), so an expired row is a due one: the plan index serves it.
-- Wherever a due row's plan + active is computed, active is capped at 100,000 years: a larger one
-- (a user's) would overflow the timestamp and fail every claim.
-- A row someone else holds locked (a user's open transaction) is skipped, not waited for: the claim
-- pass must not wait on it; it expires in a later pass.
WITH e AS (
    SELECT "id" FROM "public"."task"
    WHERE "state" = 'PLAN' AND "plan" <= statement_timestamp()
      AND "plan" + least("active", interval '100000 years') <= statement_timestamp()
      AND "repeat" = '0 sec' AND "max" >= 0
    FOR UPDATE SKIP LOCKED
)
UPDATE "public"."task" t SET "state" = 'GONE', "start" = statement_timestamp(), "stop" = statement_timestamp(),
    "error" = 'ERROR:  task not active'
FROM e WHERE t."id" = e."id"
RETURNING t."id"
