-- Maintenance (changes; the maintenance notebook runs each one only with dry_run = False).

-- purge_batch is the service's own retention_delete (pgtask/sql/maintenance.sql; see
-- SERVICE_QUERIES), given the notebook's purge_states: one batch of at most limit old rows,
-- children before parents, FOR UPDATE SKIP LOCKED. With the archive pattern installed its trigger
-- copies each deleted row into the archive.

-- query purgeable --
-- What purge_batch deletes when its batches run until one deletes nothing, counted by state: the
-- old rows (as retention_delete has them: finished, in the given states, stopped, or never started
-- and planned, before now - retention) with no descendant that is not old. The others wait: those
-- with a child, grandchild, ... queued, running, recent or in a state not purged. Exact, but for
-- rows that change meanwhile, and for one case: the batches stop early when every row a batch
-- looks at waits on a grandchild or deeper (limit or more such rows, newer than the rest: a live
-- repeat's long history); the summary then reports the rows left.
WITH RECURSIVE cutoff AS (
    SELECT coalesce(%(now)s, statement_timestamp()) - %(retention)s::interval AS at
), old AS (
    SELECT t."id", t."parent", t."state", t."stop" FROM {table} t, cutoff
    WHERE t."state" IN ('DONE', 'FAIL', 'GONE', 'STOP') AND t."state"::text = ANY(%(states)s)
      AND coalesce(t."stop", t."plan") < cutoff.at
), waiting AS (  -- old rows with a child that is not old, and their old ancestors
    SELECT o."id", o."parent" FROM old o, cutoff
    WHERE EXISTS (SELECT FROM {table} c WHERE c."parent" = o."id"
                  AND (c."state" IN ('DONE', 'FAIL', 'GONE', 'STOP')
                       AND c."state"::text = ANY(%(states)s)
                       AND coalesce(c."stop", c."plan") < cutoff.at) IS NOT TRUE)
    UNION
    SELECT o."id", o."parent" FROM waiting w JOIN old o ON o."id" = w."parent"
)
SELECT o."state"::text AS "state", count(*) AS "tasks", min(o."stop") AS "oldest_stop",
       max(o."stop") AS "newest_stop"
FROM old o WHERE NOT EXISTS (SELECT FROM waiting w WHERE w."id" = o."id")
GROUP BY 1 ORDER BY 1

-- query table_stats --
-- Dead rows and the last (auto)vacuum/analyze of the task table and its archive's partitions.
SELECT s.relname, s.n_live_tup, s.n_dead_tup, s.last_vacuum, s.last_autovacuum, s.last_analyze,
       s.last_autoanalyze
FROM pg_stat_user_tables s
WHERE s.schemaname = %(schema)s AND (s.relname = %(table)s OR s.relname LIKE %(table_like)s)
ORDER BY s.relname
