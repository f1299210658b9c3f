-- Rows of this instance's claims it does not run, each still under the claim it was seen with:
-- alive while this instance is connected, no other instance's orphan check would reset them.
WITH s AS (
    SELECT t."id" FROM "public"."task" t
    JOIN unnest(%(id)s::bigint[], %(attempt)s::int4[], %(lease)s::uuid[]) AS x("id", "attempt", "lease")
      ON t."id" = x."id" AND t."attempt" = x."attempt" AND t."lease" = x."lease"
    WHERE (-- (Included: the slot index's predicate, and the claim's count and the orphan check, which must
-- write it as the index does for the planner to use the index.) A row holding its group's slot.
"state" IN ('TAKE', 'WORK') OR ("state" = 'STOP' AND "stop" IS NULL AND "pid" IS NOT NULL))
    FOR UPDATE OF t SKIP LOCKED
)
-- (Part of reset and reset_own.) The rows s given up: a TAKE/WORK row goes back to PLAN; a STOP
-- row stays STOP (STOP is final) and gets its stop.
UPDATE "public"."task" t SET "state" = CASE WHEN t."state" = 'STOP' THEN t."state" ELSE 'PLAN' END,
    "start" = CASE WHEN t."state" = 'STOP' THEN t."start" END,
    "stop" = CASE WHEN t."state" = 'STOP' THEN statement_timestamp() END,
    "pid" = CASE WHEN t."state" = 'STOP' THEN t."pid" END
FROM s WHERE t."id" = s."id" RETURNING t."id", t."state"
