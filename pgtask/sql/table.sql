-- The task table, its enum and indexes. Placeholders ({schema}, {table}, {state}, ...) are
-- identifiers filled in by provision.py with psycopg.sql; every statement here is checked against
-- pg_catalog before it runs, so provisioning is idempotent and reports what it changed.

-- create_schema --
CREATE SCHEMA {schema}

-- create_state --
CREATE TYPE {state} AS ENUM ('PLAN', 'GONE', 'TAKE', 'WORK', 'DONE', 'FAIL', 'STOP', 'WAIT')

-- create_table --
CREATE TABLE {table} (
    "id" bigserial PRIMARY KEY,
    "parent" bigint,
    "plan" timestamptz,
    "start" timestamptz,
    "stop" timestamptz,
    "active" interval,
    "live" interval,
    "repeat" interval,
    "timeout" interval,
    "count" integer,
    "max" integer,
    "pid" integer,
    "state" {state},
    "delete" boolean,
    "drift" boolean,
    "header" boolean,
    "save" boolean,
    "string" boolean,
    "delimiter" "char",
    "escape" "char",
    "quote" "char",
    "data" text,
    "error" text,
    "group" text,
    "input" text,
    "null" text,
    "output" text,
    "remote" text,
    "user" name,
    "attempt" integer,
    "lease" uuid,
    "after" bigint[],
    "wait" integer,
    "waited" boolean,
    "retried" integer
)

-- index_plan --
-- Claiming and the next-deadline query read due PLAN rows in plan order: a partial index keeps
-- them cheap however many finished or far-future rows the table holds.
CREATE INDEX {index} ON {table} USING btree ("plan") WHERE "state" = 'PLAN'

-- index_running --
-- Group concurrency counts the rows holding a slot of their group -- TAKE/WORK, and STOP rows whose
-- task has not ended yet (it ran: a pid, and no stop) -- and orphan detection scans them (see "claim"
-- and "reset" in queries.sql). Few rows, tiny index. (Named <table>_slot_idx: the <table>_running_idx
-- of earlier versions counted TAKE/WORK only; provisioning drops it.)
CREATE INDEX {index} ON {table} USING btree ("group", "remote")
    WHERE {@slot_held}

-- slot_held --
-- (Included: the slot index's predicate, and the claim's count and the orphan check, which must
-- write it as the index does for the planner to use the index.) A row holding its group's slot.
"state" IN ('TAKE', 'WORK') OR ("state" = 'STOP' AND "stop" IS NULL AND "pid" IS NOT NULL)

-- index_group --
-- The claim walks each group's queue head in the manual's order (max, then id) and finds the
-- distinct groups by a skip scan: its cost follows the number of groups, not the backlog.
CREATE INDEX {index} ON {table} USING btree ("group", coalesce("remote", ''), greatest("max", 0) DESC, "id")
    WHERE "state" = 'PLAN'

-- index_parent --
CREATE INDEX {index} ON {table} USING btree ("parent")

-- index_state --
CREATE INDEX {index} ON {table} USING btree ("state")

-- index_after --
-- The tasks waiting on a task that ends (see "release" in triggers.sql): only waiting rows ("wait"
-- > 0) are indexed, so the rows that never name a dependency cost it nothing.
CREATE INDEX {index} ON {table} USING gin ("after") WHERE "wait" > 0

-- index_wait --
-- A group's waiting rows, counted by admission control (see "capacity" in schedule.sql).
CREATE INDEX {index} ON {table} USING btree ("group") WHERE "wait" > 0
