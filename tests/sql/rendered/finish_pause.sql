-- Negative max: push the group's other due rows |max| ms ahead (on their own grid unless drift).
-- (max / -1000.0: -max overflows the integer at the least max there is)
UPDATE "public"."task" t SET "plan" = (
    SELECT CASE WHEN t."drift" THEN statement_timestamp() + g.r ELSE -- (Part of finish_repeat, flush and finish_pause: a grid g of p, its origin, and r, its step.) The
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
 WHERE c.at > statement_timestamp()) END
    FROM (SELECT t."plan" AS p, make_interval(secs => t."max" / -1000.0) AS r) g)
WHERE t."state" = 'PLAN' AND t."plan" <= statement_timestamp() AND t."max" < 0
  AND t."group" = %(group)s AND t."remote" IS NOT DISTINCT FROM %(remote)s
  AND EXISTS (SELECT FROM "public"."task" f WHERE f."id" = %(id)s AND f."attempt" = %(attempt)s
                                      AND f."lease" = %(lease)s)
