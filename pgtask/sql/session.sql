-- A task author's session (pgtask/session.py, session_pool.py, local_input.py): its reset, the
-- preamble before a task's input, the check that lets a role that cannot log in run through SET
-- ROLE, and the error style its tasks' errors are written in (output.ErrorStyle); and, before a
-- remote task connects (queries.local_facts, for remote.py's password rule), whether its author is
-- a superuser and the local database's encoding ("remote_author").
-- The reset and the preambles are sent with every task, and the reset's text is what
-- pg_stat_activity shows for a session back in the pool: they carry no comments (see the Python
-- that sends them for what each does). {lead}, {start}, {spi}, {expected}, {settings}: filled in
-- per task (local_input.py), with str.format.

-- reset --
CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; DEALLOCATE ALL; UNLISTEN *; DISCARD TEMP; DISCARD SEQUENCES

-- unlock --
pg_advisory_unlock_all()

-- reset_session --
{@reset}; SELECT {@unlock}

-- preamble --
SET TRANSACTION READ WRITE; {lead}SELECT {start}, {spi}, {settings}

-- one_trip_preamble --
BEGIN READ WRITE; {lead}SELECT 1 / ({start} AND {spi} IS NOT DISTINCT FROM {expected})::int, {settings}; COMMIT;

-- set_role_allowed --
-- Whether a role may run through SET ROLE from the service's session: it can already act as the
-- service role (RESET ROLE gives it nothing more), or it is a superuser.
SELECT pg_has_role(%(role)s, current_user, 'USAGE') OR coalesce(
    (SELECT rolsuper FROM pg_roles WHERE rolname = %(role)s), false)

-- error_style --
SELECT current_setting('log_error_verbosity'), current_setting('log_min_error_statement')

-- remote_author --
SELECT coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = %s), false),
    current_setting('server_encoding')
