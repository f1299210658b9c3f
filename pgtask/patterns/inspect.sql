-- Queue inspection (read only), for the queue_inspection and maintenance notebooks and anyone else
-- (`pgtask status`'s own queries, which the notebook shows too, are pgtask/sql/status.sql).
-- {source} is the task table, or the task table UNION ALL its archive (see notebook.source()).
-- Every time is the database's: statement_timestamp().

-- query counts --
-- Rows by group and state: the whole table, whenever they were inserted.
SELECT "group", "state"::text AS "state", count(*) AS "tasks"
FROM {table} GROUP BY 1, 2 ORDER BY 1, 2

-- query backlog --
-- Due PLAN rows (what the service should be running now), the oldest one's age, and the future.
SELECT count(*) FILTER (WHERE "plan" <= statement_timestamp()) AS "due",
       extract(epoch FROM statement_timestamp() - min("plan") FILTER (WHERE "plan" <= statement_timestamp()))
           AS "oldest_due_seconds",
       count(*) FILTER (WHERE "plan" > statement_timestamp() AND "plan" < 'infinity') AS "planned",
       count(*) FILTER (WHERE "plan" = 'infinity') AS "waiting",
       min("plan") FILTER (WHERE "plan" > statement_timestamp() AND "plan" < 'infinity') AS "next_plan"
FROM {table} WHERE "state" = 'PLAN'

-- query backlog_over_time --
-- The due backlog at the end of each bucket of the window: a row is in it from its plan until it
-- started, or, GONE, until it expired at plan + active (its start and stop are when the service
-- noticed: a row inserted with a plan long past expires at once, and was never waiting in
-- between); a row still PLAN is in it now. A STOP row that never started is left out (when it was
-- stopped is not recorded).
WITH r AS (
    SELECT "plan", CASE WHEN "state" = 'GONE' THEN least("plan" + "active", coalesce("start", "stop"))
                        WHEN "state" <> 'PLAN' THEN coalesce("start", "stop") END AS "left_at"
    FROM {source}
    WHERE "plan" <= statement_timestamp() AND isfinite("plan")
      AND NOT ("state" = 'STOP' AND "start" IS NULL AND "stop" IS NULL)
), ev AS (
    SELECT date_bin(%(bucket)s::interval, "plan", timestamptz '2000-01-01') AS "bucket", count(*) AS "n"
    FROM r GROUP BY 1
    UNION ALL
    SELECT date_bin(%(bucket)s::interval, "left_at", timestamptz '2000-01-01'), -count(*)
    FROM r WHERE "left_at" IS NOT NULL GROUP BY 1
), per AS (
    SELECT "bucket", sum("n") AS "n" FROM ev GROUP BY 1
)
SELECT "bucket", "backlog" FROM (
    SELECT "bucket", sum("n") OVER (ORDER BY "bucket") AS "backlog" FROM per) c
WHERE "bucket" >= statement_timestamp() - %(since)s::interval
ORDER BY 1

-- query timings --
-- One row per task that ran and started within the window: pickup latency (start - plan) and run
-- time. A GONE row never ran (its start is when it expired); a STOP row that never started has none.
SELECT "id", "group", "state"::text AS "state", "plan", "start", "stop",
       extract(epoch FROM "start" - "plan") AS "pickup_seconds",
       extract(epoch FROM "stop" - "start") AS "run_seconds"
FROM {source}
WHERE "start" IS NOT NULL AND "state" <> 'GONE' AND "start" >= statement_timestamp() - %(since)s::interval
ORDER BY "start"

-- query throughput --
-- Finished tasks per time bucket and final state.
SELECT date_bin(%(bucket)s::interval, "stop", timestamptz '2000-01-01') AS "bucket",
       "state"::text AS "state", count(*) AS "tasks"
FROM {source}
WHERE "stop" >= statement_timestamp() - %(since)s::interval AND "state" IN ('DONE', 'FAIL', 'GONE', 'STOP')
GROUP BY 1, 2 ORDER BY 1, 2

-- query failures --
-- Tasks that did not succeed within the window -- FAIL, GONE (expired before they ran: "task not
-- active") and STOP (cancelled) -- by state and the first line of their error with its numbers
-- masked (timestamps -> "...", other runs of digits -> N: "task 123 failed at 2026-01-02 03:04:05"
-- and "task 7 failed at ..." are one kind of failure), with the count, the groups, the latest one's
-- time, id and a sample of its input. A STOP row that never started has no stop: its plan places it.
SELECT "state", "error", count(*) AS "tasks", max("at") AS "latest",
       (array_agg("id" ORDER BY "at" DESC, "id" DESC))[1] AS "example_id",
       string_agg(DISTINCT "group", ', ') AS "groups",
       (array_agg(left(regexp_replace("input", '\s+', ' ', 'g'), 60) ORDER BY "at" DESC, "id" DESC))[1]
           AS "sample_input"
FROM (SELECT "state"::text AS "state", "id", "group", "input",
             coalesce(regexp_replace(regexp_replace(split_part("error", E'\n', 1),
                          '\d\d\d\d-\d\d-\d\d([ T]\d\d:\d\d(:\d\d(\.\d+)?)?([+-]\d\d(:?\d\d)?|Z)?)?',
                          '...', 'g'), '\d+', 'N', 'g'),
                      CASE WHEN "state" = 'STOP' THEN 'stopped' END) AS "error",
             coalesce("stop", least("plan", statement_timestamp())) AS "at"
      FROM {source}
      WHERE "state" IN ('FAIL', 'GONE', 'STOP')) f
WHERE "at" >= statement_timestamp() - %(since)s::interval
GROUP BY 1, 2 ORDER BY 3 DESC, 4 DESC

-- query stuck --
-- Rows holding their group's slot -- TAKE/WORK, and STOP rows whose task has not ended yet (a pid,
-- no stop) -- that are orphaned (not alive as the service's orphan check sees it: the service that
-- claimed them died; pgtask resets these itself within pgtask.reset_check seconds while it runs:
-- TAKE/WORK back to PLAN, STOP ended) or running longer than stuck_after.
SELECT t."id", t."group", t."state"::text AS "state", t."start", t."pid", t."timeout",
       -- floored at 0: a row claimed while this statement runs started after its statement_timestamp()
       greatest(extract(epoch FROM statement_timestamp() - coalesce(t."start", t."plan")), 0) AS "seconds",
       o."orphaned", left(t."input", 80) AS "input"
FROM {table} t
CROSS JOIN LATERAL (SELECT {@status.sql:orphaned} AS "orphaned") o
WHERE ({@table.sql:slot_held})
  AND (statement_timestamp() - coalesce(t."start", t."plan") > %(stuck_after)s::interval OR o."orphaned")
ORDER BY t."id"
