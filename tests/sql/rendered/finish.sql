-- DONE or FAIL; a row set to STOP while running stays STOP.
UPDATE "public"."task" SET "state" = CASE WHEN "state" = 'STOP' THEN "state"
                                  WHEN %(error)s::text IS NULL THEN 'DONE' ELSE 'FAIL' END,
    "stop" = statement_timestamp(), "output" = %(output)s, "error" = %(error)s
WHERE "id" = %(id)s AND "attempt" = %(attempt)s AND "lease" = %(lease)s
  AND "state"::text IN ('TAKE', 'WORK', 'STOP')
RETURNING "state"
