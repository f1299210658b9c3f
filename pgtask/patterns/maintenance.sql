-- Maintenance (changes; the maintenance notebook runs each one only with dry_run = False).

-- purge_batch is the service's own retention_delete (pgtask/sql/maintenance.sql; see
-- SERVICE_QUERIES), given the notebook's purge_states: one batch of at most limit old rows,
-- children before parents, FOR UPDATE SKIP LOCKED. With the archive pattern installed its trigger
-- copies each deleted row into the archive. purgeable, its preview (what the batches delete, by
-- state), is the service's retention_purgeable: the same rows by the same written-once predicate.

-- query table_stats --
-- Size, live and dead rows and the last (auto)vacuum/analyze of the task table and its archive's
-- partitions (the statistics collector's figures: a VACUUM updates them as it ends).
SELECT s.relname, pg_total_relation_size(s.relid) AS total_bytes, s.n_live_tup, s.n_dead_tup,
       s.last_vacuum, s.last_autovacuum, s.last_analyze, s.last_autoanalyze
FROM pg_stat_user_tables s
WHERE s.schemaname = %(schema)s AND (s.relname = %(table)s OR s.relname LIKE %(table_like)s)
ORDER BY s.relname

-- query xmin_holder --
-- What holds back the xmin horizon -- the oldest snapshot or transaction VACUUM must keep dead rows
-- for: a session of this database (or a WAL sender: it holds every database's), a prepared
-- transaction or a replication slot (cluster-wide). The oldest one; no row when none is older than
-- this session.
SELECT * FROM (
    SELECT 'session' AS "kind", a.pid, a.datname::text AS "database", a.usename::text AS "user",
           a.application_name, a.state, age(a.backend_xmin) AS "xmin_age",
           extract(epoch FROM statement_timestamp() - a.xact_start) AS "transaction_seconds",
           left(regexp_replace(a.query, '\s+', ' ', 'g'), 80) AS "query"
    FROM pg_stat_activity a
    WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
      AND (a.datname = current_database() OR a.backend_type = 'walsender')
    UNION ALL
    SELECT 'prepared transaction', NULL, p.database::text, p.owner::text, p.gid, NULL, age(p.transaction),
           extract(epoch FROM statement_timestamp() - p.prepared), NULL
    FROM pg_prepared_xacts p
    UNION ALL
    SELECT 'replication slot', r.active_pid, r.database::text, NULL, r.slot_name::text, NULL,
           greatest(age(r.xmin), age(r.catalog_xmin)), NULL, NULL
    FROM pg_replication_slots r
    WHERE r.xmin IS NOT NULL OR r.catalog_xmin IS NOT NULL
) h
ORDER BY "xmin_age" DESC NULLS LAST
LIMIT 1
