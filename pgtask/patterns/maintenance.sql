-- Maintenance (changes; the maintenance notebook runs each one only with dry_run = False).

-- purge_batch is the service's own retention_delete (pgtask/sql/maintenance.sql; see
-- SERVICE_QUERIES), given the notebook's purge_states: one batch of at most limit old rows,
-- children before parents, FOR UPDATE SKIP LOCKED. With the archive pattern installed its trigger
-- copies each deleted row into the archive.

-- query purgeable --
-- What purge_batch deletes when its batches run until one deletes nothing, counted by state: the
-- old rows (as retention_delete has them: finished, in the given states, stopped, or never started
-- and planned, before now - retention) none of whose children is anything but old. The others
-- wait: those with a child queued, running, recent or in a state not purged. Deleting a batch
-- never makes another row deletable (it only removes old children), so this is exact but for rows
-- that change meanwhile.
WITH cutoff AS (
    SELECT coalesce(%(now)s, statement_timestamp()) - %(retention)s::interval AS at
)
SELECT t."state"::text AS "state", count(*) AS "tasks", min(t."stop") AS "oldest_stop",
       max(t."stop") AS "newest_stop"
FROM {table} t, cutoff
WHERE t."state" IN ('DONE', 'FAIL', 'GONE', 'STOP') AND t."state"::text = ANY(%(states)s)
  AND coalesce(t."stop", CASE WHEN t."pid" IS NULL THEN t."plan" END) < cutoff.at
  AND NOT EXISTS (SELECT FROM {table} c WHERE c."parent" = t."id"
                  AND (c."state" IN ('DONE', 'FAIL', 'GONE', 'STOP')
                       AND c."state"::text = ANY(%(states)s)
                       AND coalesce(c."stop", CASE WHEN c."pid" IS NULL THEN c."plan" END) < cutoff.at) IS NOT TRUE)
GROUP BY 1 ORDER BY 1

-- query table_stats --
-- Dead rows and the last (auto)vacuum/analyze of the task table and its archive's partitions.
SELECT s.relname, s.n_live_tup, s.n_dead_tup, s.last_vacuum, s.last_autovacuum, s.last_analyze,
       s.last_autoanalyze
FROM pg_stat_user_tables s
WHERE s.schemaname = %(schema)s AND (s.relname = %(table)s OR s.relname LIKE %(table_like)s)
ORDER BY s.relname
