-- A claimed task's input, left out of its claim for its size (see inputs.py); no row once its lease is lost.
SELECT "input" FROM "public"."task"
WHERE "id" = %(id)s AND "attempt" = %(attempt)s AND "lease" = %(lease)s AND "state"::text IN ('TAKE', 'WORK')
