-- Give a claimed task back (its executor could not finish it): back to PLAN to run again.
UPDATE "public"."task" SET "state" = 'PLAN', "start" = NULL, "stop" = NULL, "pid" = NULL
WHERE "id" = %(id)s AND "attempt" = %(attempt)s AND "lease" = %(lease)s AND "state"::text IN ('TAKE', 'WORK')
RETURNING "id"
