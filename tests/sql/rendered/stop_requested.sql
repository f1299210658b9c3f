-- Of the tasks this service runs (id, attempt, lease), those whose row is STOP under that very claim:
-- a 'stop <id>' notification is only a hint (any role can send one), this is what is cancelled.
-- One row: the array of their ids.
SELECT coalesce(array_agg(x."id"), '{}')
FROM unnest(%(id)s::bigint[], %(attempt)s::int4[], %(lease)s::uuid[]) AS x("id", "attempt", "lease")
JOIN "public"."task" t ON t."id" = x."id"
WHERE t."attempt" = x."attempt" AND t."lease" = x."lease" AND t."state"::text = 'STOP'
