-- The claim lock and the liveness of claimed rows. Both live in tables beside the task table that
-- only the service touches -- its owner and the roles provisioning registers, never PUBLIC -- so no
-- other role can stall the claims, pin a row or make a claimed row look dead or alive: an advisory
-- lock key is public (any role can take any key, and pg_locks shows every key held).
-- {claim}, {instance}: the tables (provision.py); {role}: a role to grant them to.

-- create_claim --
-- Claims of all service instances on one table take turns on this table's lock (see "claim_lock"
-- in queries.sql). It has no rows: nothing to vacuum, so nothing else takes the lock's mode.
CREATE TABLE {claim} ()

-- comment_claim --
COMMENT ON TABLE {claim} IS 'The claim lock of the task table: claims take turns on it (pgtask)'

-- create_instance --
-- One row per running scheduler (a service instance's entry): its token, and the control backend
-- its claims are alive on. A claimed row's lease begins with the token of the instance that
-- claimed it (see "claim" in queries.sql).
CREATE TABLE {instance} (
    "token" text PRIMARY KEY,
    "pid" integer NOT NULL,
    "started" timestamptz NOT NULL,
    "role" oid NOT NULL
)

-- comment_instance --
COMMENT ON TABLE {instance} IS 'The running pgtask schedulers of the task table and their control backends (pgtask)'

-- revoke --
REVOKE ALL ON {claim}, {instance} FROM PUBLIC

-- grant --
-- LOCK TABLE in SHARE UPDATE EXCLUSIVE mode needs UPDATE.
GRANT UPDATE ON {claim} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {instance} TO {role}

-- granted --
-- Whether {role} has the privileges "grant" gives (it owns the tables, or was granted them).
SELECT has_table_privilege(%(role)s, %(claim)s, 'UPDATE')
   AND has_table_privilege(%(role)s, %(instance)s, 'SELECT, INSERT, UPDATE, DELETE')
