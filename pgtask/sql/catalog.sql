-- What provisioning reads before it acts (provision.py and the modules beside it; "on_behalf":
-- supervisor.py, whether the service's role provisions a table for an entry's role it is a member
-- of): each step asks pg_catalog whether its object exists or differs, and only then creates or
-- alters it. %s and %(name)s are parameters; {placeholders} are filled in with psycopg.sql.

-- role_exists --
SELECT 1 FROM pg_roles WHERE rolname = %s

-- database_exists --
SELECT 1 FROM pg_database WHERE datname = %s

-- schema_exists --
SELECT 1 FROM pg_namespace WHERE nspname = %s

-- state_labels --
-- The labels of the schema's state type in their order (no row: no such type).
SELECT array_agg(e.enumlabel::text ORDER BY e.enumsortorder)
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
LEFT JOIN pg_enum e ON e.enumtypid = t.oid
WHERE n.nspname = %s AND t.typname = 'state' GROUP BY t.oid

-- table_oid --
-- A table (plain or partitioned) of the schema, by name.
SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')

-- relation --
-- A relation of any kind of the schema, by name.
SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s

-- regclass_oid --
SELECT %s::regclass::oid

-- live_columns --
SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped

-- column_exists --
-- Whether the table (its quoted identifier) has the live column of that name.
SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = {column} AND NOT attisdropped

-- table_comments --
-- The comments of a table (objsubid 0) and of its columns (their attnum).
SELECT objsubid, description FROM pg_description WHERE objoid = %s AND classoid = 'pg_class'::regclass

-- column_numbers --
SELECT attname, attnum FROM pg_attribute WHERE attrelid = %s AND attnum > 0

-- owner_privileges --
-- What the entry's role holds of the task table when another role owns it, and the table's id
-- sequence (pg_get_serial_sequence: the name already quoted by the server).
SELECT has_schema_privilege(%(r)s, %(s)s, 'USAGE'),
       has_table_privilege(%(r)s, %(t)s, 'SELECT, INSERT, UPDATE, DELETE'),
       has_sequence_privilege(%(r)s, pg_get_serial_sequence(%(t)s, 'id'), 'USAGE'),
       pg_get_serial_sequence(%(t)s, 'id')

-- column_defaults --
-- Each live column's default expression (as the server deparses it) and whether it is NOT NULL.
SELECT a.attname, pg_get_expr(d.adbin, d.adrelid), a.attnotnull
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped

-- probe_defaults --
-- The server's text of each wanted default, from the throwaway table of provision.sql's "probe".
SELECT a.attname, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a
JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = 'pg_temp.pgtask_probe'::regclass

-- check_constraints --
SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'

-- index_names --
SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = %s::regclass

-- index_on --
-- Whether the index named by its quoted identifier is one of the table's (by oid).
SELECT 1 FROM pg_index WHERE indexrelid = to_regclass(%s) AND indrelid = %s

-- user_triggers --
SELECT tgname FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal

-- trigger_exists --
SELECT 1 FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname = %s

-- function_body --
-- The body of the schema's function of that name (compared with the one provisioning would create).
SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = %s AND p.proname = %s

-- function_body_of_arity --
-- As function_body, of the function with that many arguments.
SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = %s AND p.proname = %s AND p.pronargs = %s

-- policy_exists --
SELECT 1 FROM pg_policy WHERE polrelid = %s::regclass AND polname = %s

-- keys_to_convert --
-- A key table of one namespace for all roles (see "keys_per_role" in schedule.sql): how many of its
-- reservations have no task row any more, and the name of its primary key.
SELECT (SELECT count(*) FROM {keys} k WHERE NOT EXISTS (SELECT FROM {table} t WHERE t."id" = k."task")),
       (SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p')

-- on_behalf --
SELECT current_user <> %s AND pg_has_role(current_user, %s, 'MEMBER')

-- may_create_roles --
SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user

-- grant_target --
-- An object (its quoted identifier, read as its kind's target reads it: see
-- provision_grants.AUTHOR_TARGETS) as an oid and as the server names it.
SELECT x::oid, x::text FROM (SELECT {target} AS x) t

-- privileges_held --
-- Which of the privileges the role holds on the object (its oid), asked with has_<kind>_privilege.
SELECT coalesce(array_agg(p), '{{}}') FROM unnest(%s::text[]) p WHERE {has_privilege}(%s, %s, p)

-- placeholders_needed --
-- Whether placeholders for the manual's settings are needed and may be written (see
-- provision.ensure_placeholders): before PostgreSQL 17, by a superuser.
SELECT current_setting('server_version_num')::int < 170000 AND current_setting('is_superuser') = 'on'

-- placeholder_files --
-- Of the settings asked: whether a file other than postgresql.auto.conf sets it, and whether
-- postgresql.auto.conf holds the placeholder '' for it.
SELECT lower(name), bool_or(sourcefile <> auto), bool_or(sourcefile = auto AND setting = '')
FROM pg_file_settings, (SELECT current_setting('data_directory') || '/postgresql.auto.conf' AS auto) a
WHERE lower(name) = ANY(%s) GROUP BY 1
