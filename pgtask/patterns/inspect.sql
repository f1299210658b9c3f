-- Queue inspection (read only), for the queue_inspection notebook and anyone else.
-- {source} is the task table, or the task table UNION ALL its archive (see notebook.source()).
-- Every time is the database's: statement_timestamp().

-- query counts --
-- Rows by group and state.
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

-- query timings --
-- One row per task that started within the window: pickup latency (start - plan) and run time.
SELECT "id", "group", "state"::text AS "state", "plan", "start", "stop",
       extract(epoch FROM "start" - "plan") AS "pickup_seconds",
       extract(epoch FROM "stop" - "start") AS "run_seconds"
FROM {source}
WHERE "start" IS NOT NULL AND "start" >= statement_timestamp() - %(since)s::interval
ORDER BY "start"

-- query throughput --
-- Finished tasks per time bucket and final state.
SELECT date_bin(%(bucket)s::interval, "stop", timestamptz '2000-01-01') AS "bucket",
       "state"::text AS "state", count(*) AS "tasks"
FROM {source}
WHERE "stop" >= statement_timestamp() - %(since)s::interval AND "state" IN ('DONE', 'FAIL', 'GONE', 'STOP')
GROUP BY 1, 2 ORDER BY 1, 2

-- query failures --
-- FAILed tasks within the window grouped by the first line of their error.
SELECT split_part("error", E'\n', 1) AS "error", count(*) AS "tasks", max("stop") AS "last_seen",
       max("id") AS "latest_id", string_agg(DISTINCT "group", ', ') AS "groups"
FROM {source}
WHERE "state" = 'FAIL' AND "stop" >= statement_timestamp() - %(since)s::interval
GROUP BY 1 ORDER BY 2 DESC, 3 DESC

-- query stuck --
-- Rows holding their group's slot -- TAKE/WORK, and STOP rows whose task has not ended yet (a pid,
-- no stop) -- that are orphaned (not alive as the service's orphan check sees it: the service that
-- claimed them died; pgtask resets these itself within pgtask.reset_check seconds while it runs:
-- TAKE/WORK back to PLAN, STOP ended) or running longer than stuck_after.
SELECT t."id", t."group", t."state"::text AS "state", t."start", t."pid", t."timeout",
       extract(epoch FROM statement_timestamp() - coalesce(t."start", t."plan")) AS "seconds",
       o."orphaned", left(t."input", 80) AS "input"
FROM {table} t
CROSS JOIN LATERAL (SELECT NOT {@queries.sql:alive} AS "orphaned") o
WHERE ({@table.sql:slot_held})
  AND (statement_timestamp() - coalesce(t."start", t."plan") > %(stuck_after)s::interval OR o."orphaned")
ORDER BY t."id"
