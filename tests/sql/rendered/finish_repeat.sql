-- The next occurrence: on the plan grid (the first plan + k * repeat after now), or from the stop
-- time with drift. A STOP row is not repeated. User-added columns are copied.
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
FROM "public"."task" t, LATERAL (SELECT t."plan" AS p, t."repeat" AS r) g
WHERE t."id" = %(id)s AND t."attempt" = %(attempt)s AND t."lease" = %(lease)s
  AND t."state"::text IN ('DONE', 'FAIL') AND t."repeat" > '0 sec'
