UPDATE "public"."task" SET "state" = 'WORK', "start" = statement_timestamp(), "pid" = %(pid)s
WHERE "id" = %(id)s AND "attempt" = %(attempt)s AND "lease" = %(lease)s AND "state"::text IN ('TAKE', 'WORK')
RETURNING "id"
