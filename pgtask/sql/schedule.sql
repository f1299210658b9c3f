-- Schedules, idempotency keys and group capacity: the objects beside a task table, named after it.
-- Placeholders (identifiers, filled in by provision.py with psycopg.sql):
--   {table} the task table, {schedule} {occurrence} {keys} {groups} the tables below, {open}
--   the view below, {fn} the function being created, {trigger} {index} {policy} names, {regclass}
--   the task table as a literal for ::regclass, {channel} the table's NOTIFY channel (literal).
-- Every object is created only when pg_catalog lacks it; functions are replaced when their body
-- changed. Nothing here changes what a plain INSERT INTO task does, except for groups that have a
-- row in {groups} (capacity).

-- create_schedule --
-- One row per schedule. The service (pgtask.maintenance.Materialiser) owns cursor, next_run,
-- preview, last_task and error; a user writes the rest.
CREATE TABLE {schedule} (
    "id" bigserial PRIMARY KEY,
    "name" text NOT NULL UNIQUE,
    "cron" text NOT NULL,
    "timezone" text NOT NULL DEFAULT 'UTC',
    "input" text NOT NULL,
    "columns" jsonb NOT NULL DEFAULT '{{}}' CHECK (jsonb_typeof("columns") = 'object'),
    "misfire" text NOT NULL DEFAULT 'latest' CHECK ("misfire" IN ('skip', 'latest', 'catchup')),
    "catchup" integer NOT NULL DEFAULT 10 CHECK ("catchup" BETWEEN 1 AND 1000),
    "grace" interval NOT NULL DEFAULT '1 min' CHECK ("grace" >= '0 sec'),
    "overlap" text NOT NULL DEFAULT 'allow' CHECK ("overlap" IN ('allow', 'skip')),
    "paused" boolean NOT NULL DEFAULT false,
    "user" name NOT NULL DEFAULT CURRENT_USER,
    "cursor" timestamptz,
    "next_run" timestamptz,
    "preview" timestamptz[],
    "last_task" bigint,
    "error" text,
    "created" timestamptz NOT NULL DEFAULT statement_timestamp(),
    "updated" timestamptz NOT NULL DEFAULT statement_timestamp()
)

-- comment_schedule --
COMMENT ON TABLE {schedule} IS 'Cron schedules: each due occurrence becomes one task row (pgtask)'

-- index_schedule_due --
CREATE INDEX {index} ON {schedule} USING btree ("next_run") WHERE NOT "paused"

-- create_occurrence --
-- The occurrence key: at most one task per (schedule, scheduled_for), whoever materialises it.
CREATE TABLE {occurrence} (
    "schedule" bigint NOT NULL,
    "scheduled_for" timestamptz NOT NULL,
    "task" bigint,
    "created" timestamptz NOT NULL DEFAULT statement_timestamp(),
    PRIMARY KEY ("schedule", "scheduled_for")
)

-- comment_occurrence --
COMMENT ON TABLE {occurrence} IS 'Materialised schedule occurrences (unique occurrence key) (pgtask)'

-- create_keys --
-- Idempotency reservations. Independent of the task rows: deleting task history does not release
-- a key; a key is released when it expired and its task is no longer queued or running.
-- Each role has its own keys ("user", the reserving role): the same key of two roles is two
-- reservations, and row-level security (keys_policy) keeps a role to its own rows.
CREATE TABLE {keys} (
    "key" text NOT NULL,
    "task" bigint NOT NULL,
    "created" timestamptz NOT NULL DEFAULT statement_timestamp(),
    "expires" timestamptz NOT NULL,
    "user" name NOT NULL DEFAULT CURRENT_USER,
    PRIMARY KEY ("user", "key")
)

-- keys_per_role --
-- Tables provisioned before keys were per role had one namespace ("key" alone the primary key):
-- each reservation becomes its task's role's; one whose task row is gone becomes the owner's (no
-- role is left to ask), named in the provisioning report.
ALTER TABLE {keys} ADD COLUMN "user" name;
UPDATE {keys} k SET "user" = t."user" FROM {table} t WHERE t."id" = k."task";
UPDATE {keys} SET "user" = (SELECT r.rolname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_roles r
                             ON r.oid = c.relowner WHERE c.oid = {regclass}::regclass)
WHERE "user" IS NULL;
ALTER TABLE {keys} ALTER COLUMN "user" SET NOT NULL, ALTER COLUMN "user" SET DEFAULT CURRENT_USER,
    DROP CONSTRAINT {pkey}, ADD PRIMARY KEY ("user", "key")

-- keys_policy --
-- A role sees and writes only its own reservations and those of roles it is a member of; the
-- service (is_service: its roles, the owner; superusers bypass row-level security) all of them.
ALTER TABLE {keys} ENABLE ROW LEVEL SECURITY;
CREATE POLICY {policy} ON {keys} USING ({@own_rows})

-- own_rows --
-- (Part of the policies and the view below: a row with a "user" column.) The current role's row,
-- one of a role it is a member of, or any row for the service.
"user" = current_user
           OR EXISTS (SELECT FROM pg_catalog.pg_roles r
                      WHERE r.rolname = "user" AND pg_catalog.pg_has_role(current_user, r.oid, 'MEMBER'))
           OR {is_service}(current_user)

-- schedule_policy --
-- As for the keys: a role sees, changes and deletes only its own schedules and those of roles it
-- is a member of (the guards below still decide what a member or the service may change).
ALTER TABLE {schedule} ENABLE ROW LEVEL SECURITY;
CREATE POLICY {policy} ON {schedule} USING ({@own_rows})

-- create_open --
-- The ids of the current role's tasks (and those of roles it is a member of) that are queued or
-- running: whether a reservation's task still holds its key (enqueue) without SELECT on the task
-- table, which would show a role every role's input and output. A view reads the table with its
-- owner's rights while current_user stays the caller; security_barrier keeps a caller's own
-- function in a WHERE on the view from seeing the rows the view leaves out.
CREATE VIEW {open} WITH (security_barrier) AS
SELECT t."id" FROM {table} t
WHERE t."state"::text IN ('PLAN', 'WAIT', 'TAKE', 'WORK') AND ({@own_rows})

-- comment_open --
COMMENT ON VIEW {open} IS 'Ids of the current role''s queued or running tasks (pgtask)'

-- comment_keys --
COMMENT ON TABLE {keys} IS 'Idempotency key reservations (pgtask)'

-- index_keys_expires --
CREATE INDEX {index} ON {keys} USING btree ("expires")

-- create_groups --
-- Flow control per group. "capacity": at most that many rows in PLAN, WAIT, TAKE or WORK (NULL:
-- no limit; a group without a row here is unlimited and its inserts take no lock). "paused": its
-- tasks are not claimed (running ones finish). "rate": tasks started per second (NULL: no limit),
-- with bursts of up to "burst": a token bucket the claim keeps in "tokens" and "refilled" (see
-- "claim" in queries.sql). The retry policy (NULL "retry_attempts": none; see "retry_policy"):
-- a task that ends in a state of "retry_on" runs again as a new row until it ran "retry_attempts"
-- times in all, after "retry_delay" ("fixed"), or "retry_delay" * 2^(n - 1) before its n-th retry
-- ("exponential"), at most "retry_delay_max", shortened by a random fraction of at most
-- "retry_jitter". Values that would break the arithmetic (NaN, infinity, negative, zero, an
-- unknown backoff or state) are refused by the checks, naming the column.
CREATE TABLE {groups} (
    "group" text PRIMARY KEY,
    "capacity" integer CHECK ("capacity" >= 0),
    "paused" boolean NOT NULL DEFAULT false,
    "rate" numeric CHECK ("rate" >= 0.000001 AND "rate" <= 1000000),
    "burst" integer NOT NULL DEFAULT 1 CHECK ("burst" BETWEEN 1 AND 1000000),
    "tokens" float8 NOT NULL DEFAULT 1 CHECK ("tokens" >= 0 AND "tokens" <= 1000000),
    "refilled" timestamptz NOT NULL DEFAULT statement_timestamp() CHECK (isfinite("refilled")),
    "retry_attempts" integer CHECK ("retry_attempts" BETWEEN 1 AND 1000000),
    "retry_backoff" text NOT NULL DEFAULT 'exponential' CHECK ("retry_backoff" IN ('fixed', 'exponential')),
    "retry_delay" interval NOT NULL DEFAULT '1 min' CHECK ("retry_delay" >= '0 sec' AND "retry_delay" <= '100 years'),
    "retry_delay_max" interval CHECK ("retry_delay_max" >= '0 sec' AND "retry_delay_max" <= '100 years'),
    "retry_jitter" float8 NOT NULL DEFAULT 0 CHECK ("retry_jitter" >= 0 AND "retry_jitter" <= 1),
    "retry_on" text[] NOT NULL DEFAULT '{{FAIL}}' CHECK ("retry_on" <@ ARRAY['FAIL', 'GONE'] AND array_ndims("retry_on") = 1)
)

-- groups_flow --
-- A group table of a version that had capacities only: pause and rate, as in create_groups.
ALTER TABLE {groups} ALTER COLUMN "capacity" DROP NOT NULL,
    ADD COLUMN "paused" boolean NOT NULL DEFAULT false,
    ADD COLUMN "rate" numeric CHECK ("rate" >= 0.000001 AND "rate" <= 1000000),
    ADD COLUMN "burst" integer NOT NULL DEFAULT 1 CHECK ("burst" BETWEEN 1 AND 1000000),
    ADD COLUMN "tokens" float8 NOT NULL DEFAULT 1 CHECK ("tokens" >= 0 AND "tokens" <= 1000000),
    ADD COLUMN "refilled" timestamptz NOT NULL DEFAULT statement_timestamp() CHECK (isfinite("refilled"))

-- groups_retry --
-- A group table of a version without retry policies: their columns, as in create_groups.
ALTER TABLE {groups} ADD COLUMN "retry_attempts" integer CHECK ("retry_attempts" BETWEEN 1 AND 1000000),
    ADD COLUMN "retry_backoff" text NOT NULL DEFAULT 'exponential' CHECK ("retry_backoff" IN ('fixed', 'exponential')),
    ADD COLUMN "retry_delay" interval NOT NULL DEFAULT '1 min' CHECK ("retry_delay" >= '0 sec' AND "retry_delay" <= '100 years'),
    ADD COLUMN "retry_delay_max" interval CHECK ("retry_delay_max" >= '0 sec' AND "retry_delay_max" <= '100 years'),
    ADD COLUMN "retry_jitter" float8 NOT NULL DEFAULT 0 CHECK ("retry_jitter" >= 0 AND "retry_jitter" <= 1),
    ADD COLUMN "retry_on" text[] NOT NULL DEFAULT '{{FAIL}}' CHECK ("retry_on" <@ ARRAY['FAIL', 'GONE'] AND array_ndims("retry_on") = 1)

-- comment_groups --
COMMENT ON TABLE {groups} IS 'Flow control of a group: capacity (PLAN + WAIT + TAKE + WORK rows), pause, rate (pgtask)'

-- create_service --
-- The roles pgtask's service runs as for this table (its entries' users, registered by
-- provisioning) that neither own the table nor are superusers: besides those, only they write a
-- task's progress (see "update" in triggers.sql).
CREATE TABLE {service} ("role" name PRIMARY KEY)

-- comment_service --
COMMENT ON TABLE {service} IS 'The roles the pgtask service runs as for this table (pgtask)'

-- grant_service --
-- The task table's triggers read it as the role that writes a task.
GRANT SELECT ON {service} TO PUBLIC

-- is_service --
-- is_service(role) -> whether the role writes for pgtask's service: a role provisioning registered
-- in {service}, or one that acts as the task table's owner without SET ROLE (a member with USAGE;
-- a superuser is one too). The one definition every guard beside and on the task table asks.
-- Callers test a superuser's own session first, in an expression without a query
-- (current_user = session_user AND is_superuser): the service's usual writes never get here.
CREATE OR REPLACE FUNCTION {fn}(who name) RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $body$
    SELECT EXISTS (SELECT FROM {service} s WHERE s."role" = $1)
        OR pg_has_role($1, (SELECT c.relowner FROM pg_class c WHERE c.oid = {regclass}::regclass), 'USAGE')
$body$

-- unsettable --
-- unsettable(columns) -> the names in a json object that are not task columns a user may set on
-- insert (comma-separated; NULL when there are none): unknown names and the progress columns
-- pgtask writes. task_enqueue's columns and a schedule's are checked with it.
CREATE OR REPLACE FUNCTION {fn}(columns jsonb) RETURNS text LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $body$
    SELECT string_agg(k, ', ') FROM jsonb_object_keys($1) k
    WHERE k IN ('id', 'state', 'attempt', 'lease', 'start', 'stop', 'pid', 'output', 'error', 'wait', 'waited',
                'retried')
       OR NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = {regclass}::regclass
                      AND a.attname = k AND a.attnum > 0 AND NOT a.attisdropped)
$body$

-- capacity --
-- BEFORE INSERT on the task table: admission control. Only groups with a row in {groups} are
-- checked; they serialize on that row (FOR UPDATE), so concurrent inserts count each other.
-- Under REPEATABLE READ / SERIALIZABLE the row is also touched, so a concurrent admission makes
-- this transaction fail with a serialization error (40001) instead of over-admitting.
-- A repeat of a finished task (finish_repeat) is not refused: it replaces its parent in the count.
-- That is the service's insert alone (see below): a row naming a finished repeating parent is
-- counted like any other when a user inserts it.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    cap integer;
    live bigint;
BEGIN
    IF coalesce(NEW."state", 'PLAN') NOT IN ('PLAN', 'TAKE', 'WORK') THEN
        RETURN NEW;
    END IF;
    -- a plain read first: a group without a limit takes no row lock (only the AccessShareLock
    -- any read takes, which conflicts with nothing but DDL)
    PERFORM FROM {groups} g WHERE g."group" = NEW."group" AND g."capacity" IS NOT NULL;
    IF NOT FOUND THEN
        RETURN NEW;
    END IF;
    SELECT g."capacity" INTO cap FROM {groups} g WHERE g."group" = NEW."group" FOR UPDATE;
    IF cap IS NULL THEN
        RETURN NEW;
    END IF;
    -- only the service's own insert: anyone may name a parent. (This function runs as its owner:
    -- the inserting session is session_user with no SET ROLE, or is_superuser, which follows SET ROLE.)
    IF NEW."parent" IS NOT NULL AND NEW."repeat" > '0 sec'
       AND (current_setting('is_superuser') = 'on'
            OR (current_setting('role') = 'none' AND {is_service}(session_user)))
       AND EXISTS (
            SELECT FROM {table} p WHERE p."id" = NEW."parent" AND p."group" = NEW."group"
               AND p."state" IN ('DONE', 'FAIL') AND p."repeat" > '0 sec') THEN
        RETURN NEW;
    END IF;
    -- a retry of a task (retry_policy, in the service's transaction) replaces its attempt, as a repeat does
    IF NEW."parent" IS NOT NULL AND current_setting('pgtask.retry', true) = NEW."parent"::text
       AND (current_setting('is_superuser') = 'on'
            OR (current_setting('role') = 'none' AND {is_service}(session_user))) THEN
        RETURN NEW;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        UPDATE {groups} g SET "capacity" = g."capacity" WHERE g."group" = NEW."group";
    END IF;
    -- counting stops at the capacity: the cost is bounded by the limit, not by the backlog. Queued
    -- and running rows are read through the queue and slot indexes the claim uses (an index of its
    -- own would cost every task's every state change an index entry, in every group), waiting ones
    -- (they become queued when released) through the waiting rows' index. Running, as
    -- for the claim: TAKE, WORK, and a STOP row whose task has not ended yet (a pid, no stop).
    SELECT count(*) INTO live FROM (
        SELECT FROM ((SELECT FROM {table} t WHERE t."group" = NEW."group" AND t."state" = 'PLAN' LIMIT cap)
                     UNION ALL
                     (SELECT FROM {table} t WHERE t."group" = NEW."group"
                        AND (t."state" IN ('TAKE', 'WORK') OR (t."state" = 'STOP' AND t."stop" IS NULL
                                                                AND t."pid" IS NOT NULL))
                      LIMIT cap)
                     UNION ALL
                     (SELECT FROM {table} t WHERE t."group" = NEW."group" AND t."wait" > 0
                        AND t."state"::text = 'WAIT' LIMIT cap)) u
        LIMIT cap) x;
    IF live >= cap THEN
        RAISE EXCEPTION 'group "%" is full: capacity %', NEW."group", cap
            USING ERRCODE = 'PT001',
                  DETAIL = format('%s task(s) of group %L are queued, waiting or running (PLAN, WAIT, TAKE, WORK, or STOP and not ended yet).',
                                  live, NEW."group"),
                  HINT = 'Retry later, or raise the capacity of the group.';
    END IF;
    RETURN NEW;
END
$body$

-- capacity_trigger --
CREATE TRIGGER {trigger} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {fn}()

-- retry_policy --
-- AFTER a task ends FAIL, or GONE from PLAN (it expired; one whose dependency failed is not), in a
-- group whose retry policy (see create_groups) names that state: while it ran fewer than
-- "retry_attempts" times, its next attempt is a new row -- parent = this one, so every attempt's
-- error stays readable; "retried" one more; plan = its stop + the delay; the other columns copied
-- as a repeat copies them (see "columns" in queries.sql) -- that runs as the same author: "insert"
-- in triggers.sql keeps its "user" for this insert alone (pgtask.retry names its parent), whoever
-- wrote the end (the service, which need not be a member of the author's role). The policy is
-- read now: a change applies to the next attempt. A repeating task is not retried (its next
-- occurrence is: see the trigger). A retry that cannot be inserted (a user's constraint on a
-- column of theirs) is a warning, never the finish's failure. It wakes the service itself: the
-- service's own writes send no notification (see wake_up in triggers.sql).
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    p record;
    n bigint := greatest(coalesce(NEW."retried", 0), 0)::bigint + 1;  -- the runs so far, this one's included
    secs float8;
    cols text;
BEGIN
    SELECT g."retry_attempts", g."retry_backoff", g."retry_delay", g."retry_delay_max", g."retry_jitter",
           g."retry_on" INTO p
    FROM {groups} g WHERE g."group" = NEW."group" AND g."retry_attempts" IS NOT NULL;
    -- a group without a policy stops here: the one read above is all its failures cost
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF n >= p."retry_attempts" OR NOT (NEW."state"::text = ANY (p."retry_on"))
       OR (NEW."state"::text = 'GONE' AND OLD."state"::text <> 'PLAN')
       OR NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = NEW."user") THEN
        RETURN NULL;
    END IF;
    -- in seconds: a delay doubled many times would overflow an interval (the cap is 100 years at most)
    secs := extract(epoch FROM p."retry_delay")::float8;
    IF p."retry_backoff" = 'exponential' THEN
        secs := secs * power(2::float8, least(n - 1, 64)::float8);
    END IF;
    secs := least(secs, extract(epoch FROM coalesce(p."retry_delay_max", interval '100 years'))::float8);
    secs := secs * (1 - p."retry_jitter" * random());
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO cols FROM pg_attribute a
    WHERE a.attrelid = TG_RELID AND a.attnum > 0 AND NOT a.attisdropped
      AND a.attname NOT IN ({@queries.sql:not_copied});
    BEGIN
        PERFORM set_config('pgtask.retry', NEW."id"::text, true);
        EXECUTE format('INSERT INTO %1$s ("parent", "plan", "retried", %2$s) '
                       'SELECT t."id", $2, $3, %2$s FROM %1$s t WHERE t."id" = $1', TG_RELID::regclass, cols)
            USING NEW."id", coalesce(NEW."stop", statement_timestamp()) + make_interval(secs => secs), n;
        PERFORM set_config('pgtask.retry', '', true);
    EXCEPTION WHEN others THEN
        RAISE WARNING 'task % of group % was not retried: %', NEW."id", NEW."group", SQLERRM;
        RETURN NULL;
    END;
    PERFORM pg_notify({channel}, 'wake');
    RETURN NULL;
END
$body$

-- retry_policy_trigger --
-- Only an end that can be retried calls it: a DONE row, a finish's usual end, pays its WHEN alone.
CREATE TRIGGER {trigger} AFTER UPDATE OF "state" ON {table} FOR EACH ROW
WHEN (NEW."state" IN ('FAIL', 'GONE') AND OLD."state" IS DISTINCT FROM NEW."state" AND NEW."repeat" = '0 sec')
EXECUTE FUNCTION {fn}()

-- enqueue --
-- enqueue(input, key, columns, ttl) -> (id, created): insert a task, optionally under an
-- idempotency key. While the key's reservation is alive the call creates nothing and returns the
-- reserved task's id with created = false. Runs as the caller (the task's "user" is the caller's).
-- It needs no SELECT on the task table: the id is taken first, and whether a reservation's task is
-- still queued or running is asked of {open}.
-- columns: other task columns as a jsonb object, e.g. group, plan, timeout.
-- ttl: how long the reservation lives (default: setting pg_task.key_retention, else 7 days); it
-- never expires while its task is queued or running.
CREATE OR REPLACE FUNCTION {fn}(input text, key text DEFAULT NULL, columns jsonb DEFAULT '{{}}',
                                ttl interval DEFAULT NULL)
RETURNS TABLE (id bigint, created boolean) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
#variable_conflict use_column
DECLARE
    c jsonb := coalesce($3, '{{}}') || jsonb_build_object('input', $1);
    new_id bigint;
    held bigint;
    bad text;
    names text;
BEGIN
    IF jsonb_typeof(c) <> 'object' THEN
        RAISE EXCEPTION 'columns must be a json object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    bad := {unsettable}(c);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'cannot set task column(s) %', bad USING ERRCODE = 'invalid_parameter_value',
            HINT = 'columns takes the columns a user may set on insert, e.g. group, plan, timeout.';
    END IF;
    new_id := nextval(pg_get_serial_sequence({regclass}, 'id'));
    IF $2 IS NOT NULL THEN
        -- the caller's own key: another role's reservation of the same key is not in its way
        INSERT INTO {keys} AS r ("user", "key", "task", "expires")
        VALUES (current_user, $2, new_id, statement_timestamp() + coalesce($4,
                nullif(current_setting('pg_task.key_retention', true), '')::interval, '7 days'))
        ON CONFLICT ("user", "key") DO UPDATE
            SET "task" = excluded."task", "created" = excluded."created", "expires" = excluded."expires"
            WHERE r."expires" <= statement_timestamp()
              AND NOT EXISTS (SELECT FROM {open} o WHERE o."id" = r."task")
        RETURNING r."task" INTO held;
        IF held IS NULL THEN
            SELECT r."task" INTO held FROM {keys} r WHERE r."user" = current_user AND r."key" = $2;
            RETURN QUERY SELECT held, false;
            RETURN;
        END IF;
    END IF;
    c := c || jsonb_build_object('id', new_id);
    SELECT string_agg(quote_ident(k), ', ') INTO names FROM jsonb_object_keys(c) k;
    EXECUTE format('INSERT INTO %1$s (%2$s) SELECT %2$s FROM jsonb_populate_record(NULL::%1$s, $1)',
                   {regclass}::regclass, names)
        USING c;
    RETURN QUERY SELECT new_id, true;
END
$body$

-- schedule_next --
-- schedule_next(name, n) -> the next n run times of a schedule (at most 20), as computed by the
-- service with the cron library it uses to materialise them (so they agree). Empty until the
-- service has seen the schedule (a new or changed row is picked up within a second); a schedule
-- whose expression or time zone is invalid has none and says why in its "error" column.
CREATE OR REPLACE FUNCTION {fn}(name text, n integer DEFAULT 5)
RETURNS TABLE (run_at timestamptz, local_time timestamp, timezone text) LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $body$
    SELECT p.at, p.at AT TIME ZONE s."timezone", s."timezone"
    FROM {schedule} s, unnest(s."preview") WITH ORDINALITY AS p(at, i)
    WHERE s."name" = $1 AND p.i <= $2
    ORDER BY p.i
$body$

-- schedule_guard --
-- BEFORE INSERT OR UPDATE on the schedule table: "user" is the inserting role unless that role is
-- a member of the role it names; only members of a schedule's role may change what it runs; only
-- the service (a superuser, the owner, a role in {service}) writes cursor, next_run, preview,
-- last_task and error (a cursor set back would replay past runs as the schedule's role); a new
-- schedule, a changed expression or time zone, or a resume makes the service recompute the
-- cursor from now (no runs for the past). Its task columns are checked as task_enqueue checks
-- them, when they are set: a bad one fails the INSERT or UPDATE, not every materialisation after.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    bad text;
BEGIN
    IF TG_OP = 'INSERT' OR NEW."columns" IS DISTINCT FROM OLD."columns" THEN
        -- plan too: a schedule's occurrence is the task's plan
        bad := nullif(concat_ws(', ', {unsettable}(NEW."columns" - 'plan'),
                                CASE WHEN NEW."columns" ? 'plan' THEN 'plan' END), '');
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION 'schedule "%": cannot set task column(s) %', NEW."name", bad
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'columns takes the columns a user may set on insert, e.g. group, plan, timeout.';
        END IF;
        BEGIN
            PERFORM jsonb_populate_record(NULL::{table}, NEW."columns");
        EXCEPTION WHEN others THEN
            RAISE EXCEPTION 'schedule "%": invalid columns: %', NEW."name", SQLERRM
                USING ERRCODE = 'invalid_parameter_value';
        END;
    END IF;
    IF TG_OP = 'UPDATE'
       AND (NEW."cursor", NEW."next_run", NEW."preview", NEW."last_task", NEW."error")
           IS DISTINCT FROM (OLD."cursor", OLD."next_run", OLD."preview", OLD."last_task", OLD."error")
       AND NOT ((current_user = session_user AND current_setting('is_superuser') = 'on')
                OR {is_service}(current_user)) THEN
        RAISE EXCEPTION 'permission denied to change the progress of schedule "%"', OLD."name"
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'cursor, next_run, preview, last_task and error are written by pgtask.';
    END IF;
    IF TG_OP = 'UPDATE' AND NOT pg_has_role(current_user, OLD."user", 'MEMBER') AND
       (NEW."name", NEW."cron", NEW."timezone", NEW."input", NEW."columns", NEW."misfire", NEW."catchup",
        NEW."grace", NEW."overlap", NEW."paused", NEW."user")
       IS DISTINCT FROM
       (OLD."name", OLD."cron", OLD."timezone", OLD."input", OLD."columns", OLD."misfire", OLD."catchup",
        OLD."grace", OLD."overlap", OLD."paused", OLD."user") THEN
        RAISE EXCEPTION 'permission denied to change schedule "%" of role %', OLD."name", OLD."user"
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Only members of the role a schedule runs as may change it.';
    END IF;
    IF TG_OP = 'INSERT' OR NEW."user" IS DISTINCT FROM OLD."user" THEN
        IF NEW."user" IS NULL OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = NEW."user")
           OR NOT pg_has_role(current_user, NEW."user", 'MEMBER') THEN
            NEW."user" := current_user;
        END IF;
    END IF;
    IF TG_OP = 'INSERT' OR (NEW."cron", NEW."timezone") IS DISTINCT FROM (OLD."cron", OLD."timezone")
       OR (OLD."paused" AND NOT NEW."paused") THEN
        BEGIN
            PERFORM statement_timestamp() AT TIME ZONE NEW."timezone";
        EXCEPTION WHEN others THEN
            RAISE EXCEPTION 'invalid time zone "%" for schedule "%"', NEW."timezone", NEW."name"
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Use an IANA time zone name, e.g. Europe/Berlin or UTC.';
        END;
        NEW."cursor" := NULL;
        NEW."next_run" := NULL;
        NEW."preview" := NULL;
        NEW."error" := NULL;
    END IF;
    NEW."updated" := statement_timestamp();
    RETURN NEW;
END
$body$

-- schedule_guard_trigger --
CREATE TRIGGER {trigger} BEFORE INSERT OR UPDATE ON {schedule} FOR EACH ROW EXECUTE FUNCTION {fn}()

-- schedule_delete_guard --
-- BEFORE DELETE on the schedule table: only members of a schedule's role (or the service:
-- is_service, a superuser) remove it.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    IF NOT ((EXISTS (SELECT FROM pg_roles WHERE rolname = OLD."user") AND pg_has_role(current_user, OLD."user", 'MEMBER'))
            OR {is_service}(current_user)) THEN
        RAISE EXCEPTION 'permission denied to delete schedule "%" of role %', OLD."name", OLD."user"
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Only members of the role a schedule runs as may delete it.';
    END IF;
    RETURN OLD;
END
$body$

-- schedule_delete_guard_trigger --
CREATE TRIGGER {trigger} BEFORE DELETE ON {schedule} FOR EACH ROW EXECUTE FUNCTION {fn}()

-- schedule_wake --
-- A new, changed or resumed schedule wakes the service's materialiser (a hint; it also polls).
-- The service's own updates always set next_run, so they wake nobody.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    PERFORM pg_notify({channel}, 'schedule');
    RETURN NULL;
END
$body$

-- schedule_wake_trigger --
CREATE TRIGGER {trigger} AFTER INSERT OR UPDATE ON {schedule} FOR EACH ROW
WHEN (NEW."next_run" IS NULL AND NEW."error" IS NULL) EXECUTE FUNCTION {fn}()

-- group_guard --
-- A retry policy runs every role's failed tasks of its group again, as their authors: only the
-- table's operator role ({admin}), owner, a superuser or a service role sets one. Other members
-- of the authors' role still set capacity, pause and rate (docs/flow.md). The trigger fires on an
-- insert, and on an update naming a retry column: not on the claim's token writes.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    IF (CASE WHEN TG_OP = 'INSERT' THEN NEW."retry_attempts" IS NOT NULL
             ELSE (NEW."retry_attempts", NEW."retry_backoff", NEW."retry_delay", NEW."retry_delay_max",
                   NEW."retry_jitter", NEW."retry_on")
                  IS DISTINCT FROM
                  (OLD."retry_attempts", OLD."retry_backoff", OLD."retry_delay", OLD."retry_delay_max",
                   OLD."retry_jitter", OLD."retry_on") END)
       AND NOT {is_service}(current_user)
       AND NOT coalesce(pg_has_role(current_user, (SELECT r.oid FROM pg_roles r WHERE r.rolname = {admin}), 'MEMBER'), false) THEN
        RAISE EXCEPTION 'permission denied to set the retry policy of group %', NEW."group"
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('A retry policy runs every role''s failed tasks of the group again: it is set by %s, '
                                'the table''s owner or a superuser.', {admin});
    END IF;
    RETURN NEW;
END
$body$

-- group_guard_trigger --
CREATE TRIGGER {trigger} BEFORE INSERT OR UPDATE OF "retry_attempts", "retry_backoff", "retry_delay",
    "retry_delay_max", "retry_jitter", "retry_on" ON {groups} FOR EACH ROW EXECUTE FUNCTION {fn}()

-- group_wake --
-- A group resumed, or its rate or burst changed while it is not paused: the schedulers claim at
-- once (a hint; they also poll), so a resume takes effect within a claim pass.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    PERFORM pg_notify({channel}, 'wake') WHERE NOT NEW."paused";
    RETURN NULL;
END
$body$

-- group_wake_trigger --
CREATE TRIGGER {trigger} AFTER UPDATE ON {groups} FOR EACH ROW
WHEN ((OLD."paused" AND NOT NEW."paused") OR (NEW."rate", NEW."burst") IS DISTINCT FROM (OLD."rate", OLD."burst"))
EXECUTE FUNCTION {fn}()
