-- A row set to STOP whose task ended without a finish -- the STOP came before its input began, its
-- session was lost, SIGTERM's grace period cancelled it -- gets its stop: it no longer holds its
-- group's slot (see "claim"). It stays STOP: unlike "requeue", nothing runs it again.
UPDATE "public"."task" SET "stop" = statement_timestamp()
WHERE "id" = %(id)s AND "attempt" = %(attempt)s AND "lease" = %(lease)s AND "state"::text = 'STOP'
  AND "stop" IS NULL
RETURNING "id"
