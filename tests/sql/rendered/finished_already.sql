-- After a finish written again on a new connection because the first one was lost before its answer
-- came: of the rows the retry did not match, those the first attempt finished (it committed) --
-- ended and still holding that attempt and lease, or gone when the finish was to delete the row.
-- One row: the array of their ids.
SELECT coalesce(array_agg(x."id"), '{}')
FROM unnest(%(id)s::bigint[], %(attempt)s::int4[], %(lease)s::uuid[], %(gone)s::bool[])
    AS x("id", "attempt", "lease", "gone")
LEFT JOIN "public"."task" t ON t."id" = x."id"
WHERE CASE WHEN t."id" IS NULL THEN x."gone"
           ELSE t."attempt" = x."attempt" AND t."lease" = x."lease" AND t."state"::text IN ('DONE', 'FAIL') END
