PREPARE "pgtask_flush_finish" AS -- The flush of a batch of finishes only, none of which repeats (most batches): the same finish,
-- without the WORK update and the repeat insert. Empty, those two still cost their executor start-up
-- and the table's statement triggers: about 60 us of the server's CPU a flush (a quarter of it).
WITH sync AS MATERIALIZED (SELECT set_config('synchronous_commit', 'on', true),
                                  set_config('pgtask.quiet', 'on', true)), f AS (
    -- (Part of flush and flush_finish.) DONE or FAIL for each row of the batch that still holds its
-- lease; a row set to STOP while running stays STOP. A batch is its columns' arrays, a row's values
-- at its id's position (ids are unique in a batch): the rows are read by their ids and nothing is
-- joined (see the head of this file; joined with the arrays' unnest, the rows read by id = ANY
-- were matched to every element, a batch's size squared).
UPDATE "public"."task" t SET "state" = CASE
        WHEN t."state" = 'STOP' THEN t."state"
        WHEN ($5::text[])[array_position($1::bigint[], t."id")] IS NULL THEN 'DONE'
        ELSE 'FAIL' END,
    "stop" = statement_timestamp(),
    "output" = ($4::text[])[array_position($1::bigint[], t."id")],
    "error" = ($5::text[])[array_position($1::bigint[], t."id")]
WHERE t."id" = ANY($1::bigint[])
  AND t."attempt" = ($2::int4[])[array_position($1::bigint[], t."id")]
  AND t."lease" = ($3::uuid[])[array_position($1::bigint[], t."id")]
  AND t."state"::text IN ('TAKE', 'WORK', 'STOP')
RETURNING t.*
)
SELECT 'f' AS kind, "id" FROM f UNION ALL SELECT 's', 0 FROM sync
