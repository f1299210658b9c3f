-- What provisioning changes once pg_catalog showed it missing or different (see catalog.sql):
-- roles, databases, owners, the task table's columns, comments, defaults and constraints, grants,
-- and the manual's settings' placeholders. {placeholders} are identifiers (or, where said,
-- literals or SQL text) filled in with psycopg.sql; %s are parameters.

-- lock_table --
-- One provisioner at a time per table, across service instances.
SELECT pg_advisory_xact_lock(hashtext(%s))

-- create_login_role --
CREATE ROLE {role} WITH LOGIN

-- create_role --
CREATE ROLE {role} NOLOGIN

-- create_database --
CREATE DATABASE {data} WITH OWNER = {owner}

-- create_schema_owned --
{@table.sql:create_schema} AUTHORIZATION {owner}

-- type_owner --
ALTER TYPE {object} OWNER TO {owner}

-- table_owner --
ALTER TABLE {object} OWNER TO {owner}

-- view_owner --
ALTER VIEW {object} OWNER TO {owner}

-- function_owner --
ALTER FUNCTION {object} OWNER TO {owner}

-- routine_owner --
-- (A function or a procedure.)
ALTER ROUTINE {object} OWNER TO {owner}

-- revoke_routine --
-- A routine only the roles granted it may call (functions and procedures are PUBLIC's by default).
REVOKE ALL ON ROUTINE {object} FROM PUBLIC

-- add_label --
ALTER TYPE {state} ADD VALUE {label}

-- add_column --
ALTER TABLE {table} ADD COLUMN {column} {type}

-- comment_table --
COMMENT ON TABLE {table} IS 'Tasks'

-- comment_column --
COMMENT ON COLUMN {table}.{column} IS {comment}

-- grant_schema --
GRANT USAGE ON SCHEMA {schema} TO {owner}

-- grant_table --
GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {owner}

-- grant_sequence --
GRANT USAGE ON SEQUENCE {sequence} TO {owner}

-- grant --
-- The privileges (a list), on an object of a kind, as the server names it (catalog.sql's grant_target).
GRANT {privileges} ON {kind} {target} TO {role}

-- probe --
-- A throwaway table with every wanted default (its columns: probe_column), whose text the server
-- deparses (catalog.sql's probe_defaults).
CREATE TEMP TABLE pgtask_probe ({columns}) ON COMMIT DROP

-- probe_column --
{column} {type} DEFAULT {expr}

-- drop_probe --
DROP TABLE pg_temp.pgtask_probe

-- set_default --
ALTER TABLE {table} ALTER COLUMN {column} SET DEFAULT {expr}

-- fill_default --
UPDATE {table} SET {column} = DEFAULT WHERE {column} IS NULL

-- drop_not_null --
ALTER TABLE {table} ALTER COLUMN {column} DROP NOT NULL

-- set_not_null --
ALTER TABLE {table} ALTER COLUMN {column} SET NOT NULL

-- add_check --
ALTER TABLE {table} ADD CONSTRAINT {constraint} CHECK ({check})

-- drop_index --
DROP INDEX {index}

-- register_service --
-- The role the entry's service runs as, unless it is a superuser or a member of the table's owner
-- (passed four times: the role, the role, the role, the table).
INSERT INTO {service} ("role") SELECT %s WHERE NOT EXISTS (SELECT FROM pg_roles
   WHERE rolname = %s AND (rolsuper OR pg_has_role(%s, (SELECT relowner FROM pg_class
                                                         WHERE oid = %s::regclass), 'USAGE')))
   ON CONFLICT DO NOTHING RETURNING "role"

-- know_setting --
-- Now this session knows the setting (ALTER SYSTEM before PostgreSQL 17 refuses one it does not).
SELECT set_config(%s, '', false)

-- set_placeholder --
ALTER SYSTEM SET {setting} = ''

-- reset_placeholder --
ALTER SYSTEM RESET {setting}

-- reload --
SELECT pg_reload_conf()
