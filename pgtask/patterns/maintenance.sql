-- Maintenance (changes; the maintenance notebook runs each one only with dry_run = False).

-- purge_batch is the service's own retention_delete (pgtask/sql/maintenance.sql; see
-- SERVICE_QUERIES), given the notebook's purge_states: one batch of at most limit old rows,
-- children before parents, FOR UPDATE SKIP LOCKED. With the archive pattern installed its trigger
-- copies each deleted row into the archive. purgeable, its preview (what the batches delete, by
-- state), is the service's retention_purgeable: the same rows by the same written-once predicate.

-- query table_stats --
-- Dead rows and the last (auto)vacuum/analyze of the task table and its archive's partitions.
SELECT s.relname, s.n_live_tup, s.n_dead_tup, s.last_vacuum, s.last_autovacuum, s.last_analyze,
       s.last_autoanalyze
FROM pg_stat_user_tables s
WHERE s.schemaname = %(schema)s AND (s.relname = %(table)s OR s.relname LIKE %(table_like)s)
ORDER BY s.relname
