-- pg_task's settings as the server holds them (precedence.py, spi.py): set in postgresql.conf or
-- by ALTER SYSTEM, ALTER DATABASE ... SET and ALTER ROLE ... SET.
-- spi_set_role is an expression spliced into each task's preamble (spi.setting), so it carries no
-- comment of its own: the effective pg_task.spi of the task's author after SET ROLE, whose own
-- role settings are read from the catalog first (the session's settings are the service role's).

-- connected_as --
SELECT current_user, current_database()

-- system_setting --
-- A setting as the server's configuration files and ALTER SYSTEM leave it (NULL: unset or '').
SELECT nullif(current_setting(%s, true), '')

-- db_role_settings --
-- Every ALTER DATABASE/ROLE ... SET: (database or '', role or '', 'name=value').
SELECT coalesce(d.datname, ''), coalesce(r.rolname, ''), c
FROM pg_db_role_setting s LEFT JOIN pg_database d ON d.oid = s.setdatabase
LEFT JOIN pg_roles r ON r.oid = s.setrole, unnest(s.setconfig) c

-- interval_check --
-- An interval of the configuration as PostgreSQL reads it, and whether it is not negative.
SELECT %s::interval >= interval '0'

-- spi_set_role --
SELECT coalesce((
    SELECT substr(c, length('pg_task.spi=') + 1)
    FROM pg_db_role_setting s, unnest(s.setconfig) c
    WHERE c LIKE 'pg\_task.spi=%' AND s.setrole = (SELECT oid FROM pg_roles WHERE rolname = current_user)
      AND s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
    ORDER BY s.setdatabase DESC LIMIT 1), nullif(current_setting('pg_task.spi', true), ''))
