-- Orphans: rows holding their group's slot (see "claim") that are not alive (see "alive"): the
-- service that claimed them died. A TAKE/WORK row goes back to PLAN; a STOP row stays STOP (STOP is
-- final) and gets its stop: its task ended with its service, and it no longer holds the slot.
-- Instances whose control backend is gone are forgotten.
WITH gone AS (
    DELETE FROM "public"."task_instance" i WHERE NOT -- (Part of alive and reset.) Whether the instance i's control backend is connected: its pid, of its
-- role, started when it registered (a backend_start another role's session may not see is NULL:
-- then pid and role). Only the service writes the instance table, and no other role can log in as
-- the service's: nobody else's session makes an instance look alive.
EXISTS (SELECT FROM pg_stat_activity a
        WHERE a.pid = i."pid" AND a.usesysid = i."role" AND a.datname = current_database()
          AND (a.backend_start = i."started" OR a.backend_start IS NULL))
), s AS (
    SELECT t."id" FROM "public"."task" t
    WHERE (-- (Included: the slot index's predicate, and the claim's count and the orphan check, which must
-- write it as the index does for the planner to use the index.) A row holding its group's slot.
"state" IN ('TAKE', 'WORK') OR ("state" = 'STOP' AND "stop" IS NULL AND "pid" IS NOT NULL)) AND -- (Part of claim, claim_next and reset.) The table the service knows (its oid) is the one of this
-- name now. A table dropped and provisioned again is another table, with other columns and another
-- channel: a service still holding the old oid neither claims nor resets its rows until it has
-- taken the new table up (see "next" and scheduler.Scheduler.adopt_table).
%(oid)s::oid = to_regclass('"public"."task"') AND NOT -- (Part of reset, and of the notebook's "stuck".) Whether the row t, holding its group's slot, is
-- alive: the instance that claimed it (its lease's token) is connected -- or, a local WORK or STOP
-- row, its executor session (its pid) is: that session's service is alive and only lost its control
-- connection (it registers the new one when it reconnects); reset now, the task would run a second
-- time beside the first -- or, stopped, the group's next task would start beside it. (A service
-- that died takes its sessions with it: the server ends an orphaned session's query within
-- client_connection_check_interval.) That session began before its task started; where this role
-- may not see when a session began (another role's: NULL, as its backend_type), it is of the
-- task's role: a backend that took over the pid of a session gone keeps no row alive. A row with no
-- lease (no service claimed it: written by hand) is not alive: true or false, never NULL, so that
-- NOT alive finds it too.
(coalesce(left(t."lease"::text, 18) IN (SELECT i."token" FROM "public"."task_instance" i WHERE -- (Part of alive and reset.) Whether the instance i's control backend is connected: its pid, of its
-- role, started when it registered (a backend_start another role's session may not see is NULL:
-- then pid and role). Only the service writes the instance table, and no other role can log in as
-- the service's: nobody else's session makes an instance look alive.
EXISTS (SELECT FROM pg_stat_activity a
        WHERE a.pid = i."pid" AND a.usesysid = i."role" AND a.datname = current_database()
          AND (a.backend_start = i."started" OR a.backend_start IS NULL))), false)
 OR (t."state" IN ('WORK', 'STOP') AND t."remote" IS NULL AND EXISTS (
        SELECT FROM pg_stat_activity a
        WHERE a.pid = t."pid" AND a.datname = current_database()
          AND (a.backend_start <= t."start" OR (a.backend_start IS NULL AND a.usename = t."user")))))
    FOR UPDATE OF t SKIP LOCKED
)
-- (Part of reset and reset_own.) The rows s given up: a TAKE/WORK row goes back to PLAN; a STOP
-- row stays STOP (STOP is final) and gets its stop.
UPDATE "public"."task" t SET "state" = CASE WHEN t."state" = 'STOP' THEN t."state" ELSE 'PLAN' END,
    "start" = CASE WHEN t."state" = 'STOP' THEN t."start" END,
    "stop" = CASE WHEN t."state" = 'STOP' THEN statement_timestamp() END,
    "pid" = CASE WHEN t."state" = 'STOP' THEN t."pid" END
FROM s WHERE t."id" = s."id" RETURNING t."id", t."state"
