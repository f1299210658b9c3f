-- As finish_delete, for the batch's finished rows without output and error.
DELETE FROM "public"."task" t
WHERE t."id" = ANY(%(id)s::bigint[])
  AND t."attempt" = (%(attempt)s::int4[])[array_position(%(id)s::bigint[], t."id")]
  AND t."lease" = (%(lease)s::uuid[])[array_position(%(id)s::bigint[], t."id")]
  AND t."state"::text = 'DONE' AND t."delete" AND t."output" IS NULL AND t."error" IS NULL
