-- Connection slots (pgtask/slots.py): what the executor sessions' cap is derived from.

-- slots --
-- The slots a role without special rights may use (max_connections less superuser_reserved_connections
-- and, from PostgreSQL 16, reserved_connections), and the client backends connected now (every
-- client's, this service's own included). pg_stat_activity shows every backend's type to any role.
SELECT current_setting('max_connections')::int
       - current_setting('superuser_reserved_connections')::int
       - coalesce(current_setting('reserved_connections', true)::int, 0) AS usable,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int AS connected
