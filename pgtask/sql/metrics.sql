-- Queries of the metrics' table statistics (pgtask/metrics.py), run every [pgtask] metrics_refresh
-- seconds on a connection of their own, never per scrape. Each reads an index the claim already
-- keeps, so their cost follows the queue, not the history -- but for "ended", which counts the
-- finished rows through the state index (no group: that would read every finished row's heap), and
-- runs only while "ended_estimate" says they are few.

-- read_settings --
-- The readings' connection: its server time bounded to what one backend does (no parallel
-- workers), and never waiting on a lock for long.
SET max_parallel_workers_per_gather = 0; SET lock_timeout = '1s'

-- queue --
-- Planned rows per group: how many, how many due, and the oldest due one's age (the plan index).
SELECT "group", count(*) AS planned, count(*) FILTER (WHERE "plan" <= statement_timestamp()) AS due,
       extract(epoch FROM statement_timestamp() - min("plan") FILTER (WHERE "plan" <= statement_timestamp()))::float8
FROM {table} WHERE "state" = 'PLAN'
GROUP BY 1

-- held --
-- Rows claimed or running (TAKE, WORK), and rows waiting for their dependencies (WAIT: through
-- the wait index, which holds only waiting rows), per group and state.
SELECT "group", "state"::text, count(*) FROM {table} WHERE "state" IN ('TAKE', 'WORK') GROUP BY 1, 2
UNION ALL
SELECT "group", 'WAIT', count(*) FROM {table} WHERE "wait" > 0 AND "state"::text = 'WAIT' GROUP BY 1

-- ended --
SELECT "state"::text, count(*) FROM {table} WHERE "state" IN ('DONE', 'FAIL', 'GONE', 'STOP') GROUP BY 1

-- ended_estimate --
-- The planner's estimate of the rows in one finished state ({finished}, a literal): the table's
-- statistics scaled to its current size; no row is read.
EXPLAIN (FORMAT JSON) SELECT FROM {table} WHERE "state" = {finished}

-- sessions --
-- Executor sessions of this table, of every instance of the service, by the role they run as
-- (their application_name is "pg_task <schema> <table> <group>": connect.group_settings).
SELECT usename::text, count(*) FROM pg_stat_activity
WHERE datname = current_database() AND left(application_name, length(%(prefix)s)) = %(prefix)s
GROUP BY 1

-- schedule_lag --
-- Each active schedule's due occurrence not yet materialised, in seconds (0: none is late).
SELECT "name", greatest(extract(epoch FROM statement_timestamp() - "next_run"), 0)::float8
FROM {schedule} WHERE NOT "paused" AND "next_run" IS NOT NULL

-- maintenance --
-- The entry's scheduled maintenance runs (pgtask/notebook_run.py writes one row per run, the table
-- with its first): when the last successful one ended (0: none yet) and the period of the latest
-- one's schedule (seconds; NULL: unknown). No row while nothing ran.
SELECT coalesce(extract(epoch FROM max("finished") FILTER (WHERE "ok")), 0)::float8,
       (SELECT "period" FROM {rel_maintenance_run} ORDER BY "id" DESC LIMIT 1)
FROM {rel_maintenance_run} HAVING count(*) > 0
