DELETE FROM "public"."task" WHERE "id" = %(id)s AND "attempt" = %(attempt)s AND "lease" = %(lease)s
  AND "state"::text = 'DONE' AND "delete" AND "output" IS NULL AND "error" IS NULL
