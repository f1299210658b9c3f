-- What `pgtask status` reads (pgtask/status.py), read only; the queue inspection notebook shows the
-- same. {table}: the task table; {rel_group}, {rel_instance}: the group and instance tables beside
-- it; {schema_name}, {table_name}: the names as text literals. Every time is the database's:
-- statement_timestamp().

-- settings --
-- The command's connection plans without JIT compilation: up to the threshold of finished rows
-- (pgtask/status.py) the groups query reads every row of the table, and past some 50,000 rows its
-- cost crosses the server's JIT thresholds: compiling took 2.8 s of that query's 3.0 s when it
-- read a million rows (docs/performance.md, "How the cost grows").
SET jit = off

-- table_oid --
-- The task table, when there is one.
SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = %(table)s

-- window_seconds --
-- The window of the per-group figures, in seconds (their rate is finished tasks over it).
SELECT extract(epoch FROM %(since)s::interval)::float8

-- orphaned --
-- (Included by liveness, and by the notebooks' "stuck" in pgtask/patterns/inspect.sql: whether a
-- service looks after a row is decided here only.)
-- A row t holding its group's slot is orphaned when it is not alive as the service's own orphan
-- reset sees it (pgtask/sql/queries.sql, alive).
NOT {@queries.sql:alive}

-- liveness --
-- Is a service looking after this table? One row: the `pgtask run` schedulers connected to it
-- (their sessions' application_name is "pg_work <schema> <table> <sleep ms>"), when the first one
-- connected and when one last ran a statement; the rows running under a live service and the
-- orphaned ones; the due backlog -- all of it, and the part whose group has a free slot (a group
-- runs max + 1 at once: rows queued behind a running one of a serial group are not late) -- and
-- when a task last started. The ages of other sessions' doings are floored at 0: a service that
-- runs a statement, connects or starts a task while this statement runs stamps it a little after
-- this statement's statement_timestamp(), on the same clock.
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
       (SELECT greatest(extract(epoch FROM statement_timestamp() - min(backend_start)), 0) FROM svc)
           AS "up_seconds",
       (SELECT greatest(extract(epoch FROM statement_timestamp() - max(state_change)), 0) FROM svc)
           AS "idle_seconds",
       (SELECT coalesce(sum("n" - "orphaned"), 0) FROM held) AS "running",
       (SELECT coalesce(sum("orphaned"), 0) FROM held) AS "orphaned",
       (SELECT count(*) FROM due) AS "due",
       (SELECT extract(epoch FROM statement_timestamp() - min("plan")) FROM due) AS "oldest_due_seconds",
       (SELECT count(*) FROM due WHERE "free") AS "due_free",
       (SELECT extract(epoch FROM statement_timestamp() - min("plan")) FROM due WHERE "free")
           AS "oldest_free_due_seconds",
       (SELECT greatest(extract(epoch FROM statement_timestamp() - greatest(
            -- a table past the threshold (bounded): the running rows (the slot index) and the newest
            -- started ones by id (ids grow with time; the primary key read backwards), not the history
            (SELECT max("start") FROM {table} WHERE NOT %(bounded)s AND "start" IS NOT NULL AND "state" <> 'GONE'),
            (SELECT max("start") FROM {table} t WHERE %(bounded)s AND ({@table.sql:slot_held})),
            (SELECT max("start") FROM (SELECT "start" FROM {table} WHERE %(bounded)s AND "start" IS NOT NULL
                                       AND "state" <> 'GONE' ORDER BY "id" DESC LIMIT %(recent)s) r))), 0))
           AS "last_start_seconds"

-- groups --
-- One row per group, the busiest first: its backlog now (due, the oldest due one's age, planned),
-- the rows holding its slots -- running under a live service, and orphaned (their service died:
-- counted apart, as liveness does) --, what finished within the window (since) and in the whole table, its failure rate
-- (FAIL, GONE and STOP among the finished in the window), throughput (finished a second over the
-- window), and the pickup latency (start - plan) of the tasks that started in the window -- rows
-- that ran only: a GONE row's start is when it expired.
SELECT "group",
       count(*) FILTER (WHERE "state" = 'PLAN' AND "plan" <= statement_timestamp()) AS "due",
       extract(epoch FROM statement_timestamp()
               - min("plan") FILTER (WHERE "state" = 'PLAN' AND "plan" <= statement_timestamp()))
           AS "oldest_due_seconds",
       count(*) FILTER (WHERE "state" = 'PLAN' AND "plan" > statement_timestamp()) AS "planned",
       count(*) FILTER (WHERE ({@table.sql:slot_held}) AND NOT ({@orphaned})) AS "running",
       count(*) FILTER (WHERE ({@table.sql:slot_held}) AND ({@orphaned})) AS "orphaned",
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
FROM {table} t
-- A table past the threshold (bounded) reads its live rows (the plan and slot indexes) and the rows
-- after the id "window_rows" finds (the primary key), not the history; its "(all)" figures are
-- then the planner's estimates (status.finished_estimate).
WHERE NOT %(bounded)s OR "state" = 'PLAN' OR ({@table.sql:slot_held}) OR "id" > %(after)s
GROUP BY "group"

-- window_rows --
-- (A table past the threshold.) The rows the groups query reads beside the live ones, from the
-- newest %(recent)s by id (the primary key read backwards: ids grow with time). "after": the id
-- they follow -- the newest one planned before the window (0: every row is newer); when all of
-- those rows were planned within the window, the oldest of them, and "capped": the part of the
-- window they cover (back to their earliest plan), which the groups query counts instead.
WITH newest AS (SELECT "id", least("plan", statement_timestamp()) AS "plan" FROM {table}
                ORDER BY "id" DESC LIMIT %(recent)s),
     seen AS (SELECT count(*) AS "n", max("id") FILTER (WHERE "plan" < statement_timestamp() - %(since)s::interval)
                     AS "before", min("id") AS "oldest", min("plan") AS "earliest" FROM newest)
SELECT CASE WHEN "before" IS NOT NULL OR "n" < %(recent)s THEN coalesce("before", 0) ELSE "oldest" - 1 END
           AS "after",
       CASE WHEN "before" IS NULL AND "n" >= %(recent)s THEN statement_timestamp() - "earliest" END AS "capped"
FROM seen

-- flow --
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

-- longest --
-- The task running longest now (TAKE/WORK), with its group and the start of its input. Its age
-- is floored at 0 as in liveness: one claimed while this statement runs started after it.
SELECT "id", "group", "state"::text AS "state", "pid",
       greatest(extract(epoch FROM statement_timestamp() - coalesce("start", "plan")), 0) AS "seconds",
       left(regexp_replace("input", '\s+', ' ', 'g'), 60) AS "input"
FROM {table}
WHERE "state" IN ('TAKE', 'WORK')
ORDER BY coalesce("start", "plan"), "id" LIMIT 1
