PREPARE "pgtask_flush" AS -- Group commit: the TAKE -> WORK transitions and the finishes of many tasks in one statement (one
-- commit). Each row stays fenced on attempt + lease exactly as in "work" and "finish"; a finished
-- row's next repeat is inserted from the finish's own result (so a row the finish did not match is
-- never repeated). Returns the rows that matched: kind 'w' (now WORK), 'f' (finished), 'r' (repeat).
-- A failing trigger fails the whole statement: the service then writes each row on its own.
-- The statement is its own transaction; it commits without waiting for the WAL flush when it holds
-- only TAKE -> WORK transitions ($10 = 'off'; see completer.Completer.flush for why that is safe). It
-- sends no wake-up notification (pgtask.quiet): the service wakes itself when it inserted a repeat.
WITH sync AS MATERIALIZED (SELECT set_config('synchronous_commit', $10, true),
                                  set_config('pgtask.quiet', 'on', true)), w AS (
    UPDATE "public"."task" t SET "state" = 'WORK', "start" = statement_timestamp(),
        "pid" = ($4::int4[])[array_position($1::bigint[], t."id")]
    -- WORK too: a retry after a lost connection may find its own first attempt committed.
    WHERE t."id" = ANY($1::bigint[])
      AND t."attempt" = ($2::int4[])[array_position($1::bigint[], t."id")]
      AND t."lease" = ($3::uuid[])[array_position($1::bigint[], t."id")]
      AND t."state"::text IN ('TAKE', 'WORK')
    RETURNING t."id"
), f AS (
    -- (Part of flush and flush_finish.) DONE or FAIL for each row of the batch that still holds its
-- lease; a row set to STOP while running stays STOP. A batch is its columns' arrays, a row's values
-- at its id's position (ids are unique in a batch): the rows are read by their ids and nothing is
-- joined (see the head of this file; joined with the arrays' unnest, the rows read by id = ANY
-- were matched to every element, a batch's size squared).
UPDATE "public"."task" t SET "state" = CASE
        WHEN t."state" = 'STOP' THEN t."state"
        WHEN ($9::text[])[array_position($5::bigint[], t."id")] IS NULL THEN 'DONE'
        ELSE 'FAIL' END,
    "stop" = statement_timestamp(),
    "output" = ($8::text[])[array_position($5::bigint[], t."id")],
    "error" = ($9::text[])[array_position($5::bigint[], t."id")]
WHERE t."id" = ANY($5::bigint[])
  AND t."attempt" = ($6::int4[])[array_position($5::bigint[], t."id")]
  AND t."lease" = ($7::uuid[])[array_position($5::bigint[], t."id")]
  AND t."state"::text IN ('TAKE', 'WORK', 'STOP')
RETURNING t.*
), r AS (
    -- as finish_repeat, from the finished rows
    INSERT INTO "public"."task" ("parent", "plan", active, live, repeat, timeout, count, max, delete, drift, header, save, string, delimiter, escape, quote, data, "group", input, "null", remote, "user")
    SELECT t."id", CASE WHEN t."drift" THEN t."stop" + t."repeat" ELSE -- (Part of finish_repeat, flush and finish_pause: a grid g of p, its origin, and r, its step.) The
-- first p + k * r after now (k >= 1), at the same cost however far p lies behind: k is estimated
-- from the microseconds between p and now (a month counted as the Gregorian calendar's average,
-- 30.436875 days), and only the points that can be the first are computed, exactly as PostgreSQL
-- adds an interval (months, then days in the time zone, then microseconds: no floating point).
-- A step of microseconds only is exact: one point. Calendar months stray from their average by a
-- few days, and days from 24 hours by the time zone's changes of offset: the points within 8
-- (months) or 2 (days) days of the estimate. (r has no negative part and is at most 100,000 years,
-- p is finite: the insert and update triggers see to it -- so no point computed overflows.)
(SELECT min(c.at) FROM (
    SELECT g.p + make_interval(months => (k * e.mon)::int, days => (k * e.day)::int,
                               hours => div(k * e.us, 3600000000)::int,
                               secs => mod(k * e.us, 3600000000) / 1000000.0) AS at
    FROM (SELECT m.mon, m.day, m.us, m.mon * 2629746000000 + m.day * 86400000000 + m.us AS step,
                 (extract(epoch FROM statement_timestamp()) - extract(epoch FROM g.p)) * 1000000 AS d,
                 CASE WHEN m.mon > 0 THEN 691200000000 WHEN m.day > 0 THEN 172800000000 ELSE 0 END AS off
          FROM (SELECT extract(year FROM g.r) * 12 + extract(month FROM g.r) AS mon,
                       extract(day FROM g.r) AS day,
                       extract(epoch FROM g.r - date_trunc('day', g.r)) * 1000000 AS us) m) e,
         generate_series(greatest(div(e.d - e.off, e.step) + 1, 1)::bigint,
                         greatest(div(e.d + e.off, e.step) + 1, 1)::bigint) AS k) c
 WHERE c.at > statement_timestamp()) END, t.active, t.live, t.repeat, t.timeout, t.count, t.max, t.delete, t.drift, t.header, t.save, t.string, t.delimiter, t.escape, t.quote, t.data, t."group", t.input, t."null", t.remote, t."user"
    FROM f t, LATERAL (SELECT t."plan" AS p, t."repeat" AS r) g
    WHERE t."state" IN ('DONE', 'FAIL') AND t."repeat" > '0 sec'
    RETURNING "id"
)
SELECT 'w' AS kind, "id" FROM w UNION ALL SELECT 'f', "id" FROM f UNION ALL SELECT 'r', "id" FROM r
UNION ALL SELECT 's', 0 FROM sync
