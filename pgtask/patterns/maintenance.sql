-- Maintenance (changes; the maintenance notebook runs each one only with dry_run = False).

-- query purgeable --
-- What purge_batch would delete, counted by state.
SELECT "state"::text AS "state", count(*) AS "tasks", min("stop") AS "oldest_stop", max("stop") AS "newest_stop"
FROM {table}
WHERE "state"::text = ANY(%(states)s) AND "stop" < statement_timestamp() - %(older_than)s::interval
GROUP BY 1 ORDER BY 1

-- query purge_batch --
-- One batch of finished rows older than older_than (by stop). With the archive pattern installed
-- its trigger copies each deleted row into the archive.
DELETE FROM {table} WHERE "id" IN (
    SELECT "id" FROM {table}
    WHERE "state"::text = ANY(%(states)s) AND "stop" < statement_timestamp() - %(older_than)s::interval
    ORDER BY "stop" LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED)
RETURNING "id"

-- query table_stats --
-- Dead rows and the last (auto)vacuum/analyze of the task table and its archive's partitions.
SELECT s.relname, s.n_live_tup, s.n_dead_tup, s.last_vacuum, s.last_autovacuum, s.last_analyze,
       s.last_autoanalyze
FROM pg_stat_user_tables s
WHERE s.schemaname = %(schema)s AND (s.relname = %(table)s OR s.relname LIKE %(table_like)s)
ORDER BY s.relname
