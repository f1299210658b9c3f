-- Queue inspection (read only), for `pgtask status`, the queue_inspection notebook and anyone else.
-- {source} is the task table, or the task table UNION ALL its archive (see notebook.source()).
-- Every time is the database's: statement_timestamp().

-- query orphaned --
-- (Included by liveness and stuck: whether a service looks after a row is decided here only.)
-- A row t holding its group's slot is orphaned when it is not alive as the service's own orphan
-- reset sees it (pgtask/sql/queries.sql, alive).
NOT {@queries.sql:alive}

-- query liveness --
-- Is a service looking after this table? One row: the `pgtask run` schedulers connected to it
-- (their sessions' application_name is "pg_work <schema> <table> <sleep ms>"), when the first one
-- connected and when one last ran a statement; the rows running under a live service and the
-- orphaned ones; the due backlog -- all of it, and the part whose group has a free slot (a group
-- runs max + 1 at once: rows queued behind a running one of a serial group are not late) -- and
-- when a task last started.
WITH svc AS (
    SELECT a.pid, a.backend_start, a.state_change, a.client_addr
    FROM pg_stat_activity a
    WHERE a.datname = current_database()
      AND left(a.application_name, length(left('pg_work ' || {schema_name} || ' ' || {table_name} || ' ', 63)))
          = left('pg_work ' || {schema_name} || ' ' || {table_name} || ' ', 63)
), held AS (
    SELECT t."group", coalesce(t."remote", '') AS "remote", count(*) AS "n",
           count(*) FILTER (WHERE {@orphaned}) AS "orphaned"
    FROM {table} t WHERE ({@table.sql:slot_held}) GROUP BY 1, 2
), due AS (
    -- a paused group's rows wait by design, and a rate-limited group's at its pace: neither is late
    SELECT d."plan", greatest(d."max", 0) + 1 > coalesce(h."n", 0) AND g."group" IS NULL AS "free"
    FROM {table} d LEFT JOIN held h ON h."group" = d."group" AND h."remote" = coalesce(d."remote", '')
    LEFT JOIN {rel_group} g ON g."group" = d."group" AND (g."paused" OR g."rate" IS NOT NULL)
    WHERE d."state" = 'PLAN' AND d."plan" <= statement_timestamp()
)
SELECT (SELECT count(*) FROM svc) AS "services",
       (SELECT string_agg(pid::text, ', ' ORDER BY pid) FROM svc) AS "service_pids",
       (SELECT extract(epoch FROM statement_timestamp() - min(backend_start)) FROM svc) AS "up_seconds",
       (SELECT extract(epoch FROM statement_timestamp() - max(state_change)) FROM svc) AS "idle_seconds",
       (SELECT coalesce(sum("n" - "orphaned"), 0) FROM held) AS "running",
       (SELECT coalesce(sum("orphaned"), 0) FROM held) AS "orphaned",
       (SELECT count(*) FROM due) AS "due",
       (SELECT extract(epoch FROM statement_timestamp() - min("plan")) FROM due) AS "oldest_due_seconds",
       (SELECT count(*) FROM due WHERE "free") AS "due_free",
       (SELECT extract(epoch FROM statement_timestamp() - min("plan")) FROM due WHERE "free")
           AS "oldest_free_due_seconds",
       (SELECT extract(epoch FROM statement_timestamp() - max("start")) FROM {table}
        WHERE "start" IS NOT NULL AND "state" <> 'GONE') AS "last_start_seconds"

-- query counts --
-- Rows by group and state: the whole table, whenever they were inserted.
SELECT "group", "state"::text AS "state", count(*) AS "tasks"
FROM {table} GROUP BY 1, 2 ORDER BY 1, 2

-- query groups --
-- One row per group, the busiest first: its backlog now (due, the oldest due one's age, planned,
-- running), what finished within the window (since) and in the whole table, its failure rate
-- (FAIL, GONE and STOP among the finished in the window), throughput (finished a second over the
-- window), and the pickup latency (start - plan) of the tasks that started in the window -- rows
-- that ran only: a GONE row's start is when it expired.
SELECT "group",
       count(*) FILTER (WHERE "state" = 'PLAN' AND "plan" <= statement_timestamp()) AS "due",
       extract(epoch FROM statement_timestamp()
               - min("plan") FILTER (WHERE "state" = 'PLAN' AND "plan" <= statement_timestamp()))
           AS "oldest_due_seconds",
       count(*) FILTER (WHERE "state" = 'PLAN' AND "plan" > statement_timestamp()) AS "planned",
       count(*) FILTER (WHERE "state" IN ('TAKE', 'WORK')) AS "running",
       count(*) FILTER (WHERE "state" = 'DONE' AND "stop" >= statement_timestamp() - %(since)s::interval)
           AS "done_window",
       count(*) FILTER (WHERE "state" = 'FAIL' AND "stop" >= statement_timestamp() - %(since)s::interval)
           AS "fail_window",
       count(*) FILTER (WHERE "state" = 'GONE' AND "stop" >= statement_timestamp() - %(since)s::interval)
           AS "gone_window",
       count(*) FILTER (WHERE "state" = 'STOP'
                        AND coalesce("stop", least("plan", statement_timestamp()))
                            >= statement_timestamp() - %(since)s::interval) AS "stop_window",
       count(*) FILTER (WHERE "state" = 'DONE') AS "done",
       count(*) FILTER (WHERE "state" = 'FAIL') AS "fail",
       count(*) FILTER (WHERE "state" = 'GONE') AS "gone",
       count(*) FILTER (WHERE "state" = 'STOP') AS "stop",
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM "start" - "plan"))
           FILTER (WHERE "state" <> 'GONE' AND "start" >= statement_timestamp() - %(since)s::interval)
           AS "pickup_p50_seconds",
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM "start" - "plan"))
           FILTER (WHERE "state" <> 'GONE' AND "start" >= statement_timestamp() - %(since)s::interval)
           AS "pickup_p99_seconds"
FROM {table}
GROUP BY "group"

-- query flow --
-- The groups under flow control (a row in the group table), paused ones first: capacity, pause,
-- rate and burst, the rate's tokens now (as the claim counts them: see "flow" in queries.sql),
-- and the group's due and waiting (WAIT: dependencies) tasks.
SELECT g."group", g."capacity", g."paused", g."rate"::float8 AS "rate", g."burst",
       CASE WHEN g."rate" IS NOT NULL THEN least(g."burst", g."tokens"::numeric + g."rate" * greatest(
           extract(epoch FROM statement_timestamp() - g."refilled"), 0))::float8 END AS "tokens",
       (SELECT count(*) FROM {table} t WHERE t."state" = 'PLAN' AND t."group" = g."group"
                                         AND t."plan" <= statement_timestamp()) AS "due",
       (SELECT count(*) FROM {table} t WHERE t."wait" > 0 AND t."group" = g."group"
                                         AND t."state"::text = 'WAIT') AS "waiting"
FROM {rel_group} g
ORDER BY g."paused" DESC, g."group"

-- query longest --
-- The task running longest now (TAKE/WORK), with its group and the start of its input.
SELECT "id", "group", "state"::text AS "state", "pid",
       extract(epoch FROM statement_timestamp() - coalesce("start", "plan")) AS "seconds",
       left(regexp_replace("input", '\s+', ' ', 'g'), 60) AS "input"
FROM {table}
WHERE "state" IN ('TAKE', 'WORK')
ORDER BY coalesce("start", "plan"), "id" LIMIT 1

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
-- started (or expired: GONE); a row still PLAN is in it now. A STOP row that never started is left
-- out (when it was stopped is not recorded).
WITH r AS (
    SELECT "plan", CASE WHEN "state" <> 'PLAN' THEN coalesce("start", "stop") END AS "left_at"
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
-- active") and STOP (cancelled) -- by state and the first line of their error, with the groups,
-- the latest one and a sample of its input. A STOP row that never started has no stop: its plan
-- places it.
SELECT "state"::text AS "state",
       coalesce(split_part("error", E'\n', 1), CASE WHEN "state" = 'STOP' THEN 'stopped' END) AS "error",
       count(*) AS "tasks", max(coalesce("stop", least("plan", statement_timestamp()))) AS "last_seen",
       max("id") AS "latest_id", string_agg(DISTINCT "group", ', ') AS "groups",
       (array_agg(left(regexp_replace("input", '\s+', ' ', 'g'), 60) ORDER BY "id" DESC))[1] AS "sample_input"
FROM {source}
WHERE "state" IN ('FAIL', 'GONE', 'STOP')
  AND coalesce("stop", least("plan", statement_timestamp())) >= statement_timestamp() - %(since)s::interval
GROUP BY 1, 2 ORDER BY 3 DESC, 4 DESC

-- query stuck --
-- Rows holding their group's slot -- TAKE/WORK, and STOP rows whose task has not ended yet (a pid,
-- no stop) -- that are orphaned (not alive as the service's orphan check sees it: the service that
-- claimed them died; pgtask resets these itself within pgtask.reset_check seconds while it runs:
-- TAKE/WORK back to PLAN, STOP ended) or running longer than stuck_after.
SELECT t."id", t."group", t."state"::text AS "state", t."start", t."pid", t."timeout",
       extract(epoch FROM statement_timestamp() - coalesce(t."start", t."plan")) AS "seconds",
       o."orphaned", left(t."input", 80) AS "input"
FROM {table} t
CROSS JOIN LATERAL (SELECT {@orphaned} AS "orphaned") o
WHERE ({@table.sql:slot_held})
  AND (statement_timestamp() - coalesce(t."start", t."plan") > %(stuck_after)s::interval OR o."orphaned")
ORDER BY t."id"
