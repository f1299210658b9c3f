-- The helper triggers of the manual, one function per concern, each named after its table.
-- Placeholders: {schema} {table} {state} (identifiers), {fn} (the function), {channel} (literal).

-- wake_up --
-- Statement-level wake-up: a NOTIFY on the table's channel. Notifications are hints; the service
-- also polls, so a lost or coalesced one only delays a task until the next poll. The service's own
-- writes (the next repeat inserted with a finish) say pgtask.quiet = on: it wakes itself, and its
-- commits do not queue behind the cluster-wide notification lock.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    IF current_setting('pgtask.quiet', true) IS DISTINCT FROM 'on' THEN
        PERFORM pg_notify({channel}, 'wake');
    END IF;
    RETURN NULL;
END
$body$

-- wake_up_trigger --
CREATE TRIGGER {trigger} AFTER INSERT OR DELETE OR UPDATE OF "plan" ON {table}
FOR EACH STATEMENT EXECUTE FUNCTION {fn}()

-- settings --
-- Statement-level check of the pg_task.* settings the column defaults read, so a bad value fails
-- the INSERT naming the setting instead of with a bare cast error. Unset and '' mean "default".
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    setting record;
    value text;
BEGIN
    FOR setting IN SELECT * FROM (VALUES
        ('pg_task.active', 'interval'), ('pg_task.live', 'interval'), ('pg_task.repeat', 'interval'),
        ('pg_task.timeout', 'interval'), ('pg_task.count', 'integer'), ('pg_task.max', 'integer'),
        ('pg_task.delete', 'boolean'), ('pg_task.drift', 'boolean'), ('pg_task.header', 'boolean'),
        ('pg_task.save', 'boolean'), ('pg_task.string', 'boolean'), ('pg_task.delimiter', '"char"'),
        ('pg_task.escape', '"char"'), ('pg_task.quote', '"char"'), ('pg_task.plan', 'timestamptz'),
        ('pg_task.id', 'bigint')) AS s(name, type)
    LOOP
        value := nullif(current_setting(setting.name, true), '');
        CONTINUE WHEN value IS NULL OR (setting.name = 'pg_task.plan' AND value = 'statement_timestamp()');
        BEGIN
            EXECUTE format('SELECT %L::%s', value, setting.type);
            IF setting.type = '"char"' AND octet_length(value) > 1 THEN
                RAISE EXCEPTION 'must be a single character';
            END IF;
        EXCEPTION WHEN others THEN
            RAISE EXCEPTION 'invalid value for setting "%": %', setting.name, value
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = format('expected %s: %s', setting.type, SQLERRM),
                      HINT = format('SET %s to a valid value, or RESET it to use the default.', setting.name);
        END;
    END LOOP;
    RETURN NULL;
END
$body$

-- settings_trigger --
CREATE TRIGGER {trigger} BEFORE INSERT ON {table} FOR EACH STATEMENT EXECUTE FUNCTION {fn}()

-- insert --
-- "user" is the inserting role, unless that role is a member of the role it names -- or the row is
-- a retry: a copy of an ended attempt (FAIL, GONE or STOP) of that role, named by its "parent",
-- inserted by a service role (is_service: the table's owner, as the group's retry policy and the
-- retry verb run, see retry_policy in schedule.sql and retry in verbs.sql) under pgtask.retry.
-- Anyone may set pgtask.retry; no other role's insert passes is_service, and no row but such a
-- copy keeps a foreign author. A row starts
-- PLAN (or STOP: held back for good) with no backend of its own, unless the service inserts it
-- (see "update" for who that is): a row inserted as WORK with someone's pid would let the STOP
-- trigger cancel that backend.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    IF (NEW."pid" IS NOT NULL OR NEW."state" NOT IN ('PLAN', 'STOP'))
       AND NOT (current_user = session_user AND current_setting('is_superuser') = 'on') THEN
        IF NOT {is_service}(current_user) THEN
            RAISE EXCEPTION 'permission denied to insert task in state % or with a pid', NEW."state"
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Insert tasks in state PLAN (the default) or STOP; pgtask writes the rest.';
        END IF;
    END IF;
    IF NEW."user" IS NULL
       OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = NEW."user")
       OR NOT pg_has_role(current_user, NEW."user", 'MEMBER') THEN
        -- the task table is read only for the service, in an IF of its own: a subquery's privileges
        -- are checked when its expression starts, and other roles need not have SELECT on it
        IF coalesce(current_setting('pgtask.retry', true), '') <> '' AND {is_service}(current_user) THEN
            IF NOT EXISTS (SELECT FROM {table} p JOIN pg_roles r ON r.rolname = p."user"
                           WHERE p."id" = NEW."parent" AND p."user" = NEW."user"
                             AND p."state"::text IN ('FAIL', 'GONE', 'STOP')) THEN
                NEW."user" := current_user;
            END IF;
        ELSE
            NEW."user" := current_user;
        END IF;
    END IF;
    {@definition_check}
    NEW."state" := coalesce(NEW."state", 'PLAN');
    NEW."attempt" := 0;
    NEW."lease" := NULL;
    RETURN NEW;
END
$body$

-- definition_check --
-- (Part of insert and update: the new row's definition, as it is inserted or edited.) Values no
-- next occurrence can be computed from are refused here, naming the column, instead of failing
-- the task's finish after its input ran: a plan of -infinity (no grid, and never active), and a
-- repeat over 100,000 years (its next plan overflows the timestamp) or with a negative part (a
-- month less 30 days: its points need not move forward). Nothing here runs on the service's
-- claims and finishes, which change no definition.
IF NEW."plan" = '-infinity' THEN
        RAISE EXCEPTION 'invalid plan of task: -infinity' USING ERRCODE = 'check_violation',
            HINT = 'plan is a finite time, or infinity to hold the task back.';
    END IF;
    IF NEW."repeat" > '0 sec' AND (NEW."repeat" > '100000 years'
                                  OR date_trunc('month', NEW."repeat") < '0 sec'
                                  OR date_trunc('day', NEW."repeat") < date_trunc('month', NEW."repeat")
                                  OR NEW."repeat" < date_trunc('day', NEW."repeat")) THEN
        RAISE EXCEPTION 'invalid repeat of task: %', NEW."repeat" USING ERRCODE = 'check_violation',
            HINT = 'repeat is at most 100000 years, and none of its months, days and time is negative.';
    END IF;

-- insert_trigger --
CREATE TRIGGER {trigger} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {fn}()

-- start --
-- A local task's executor session marks its own task WORK -- state, start, its backend pid -- in
-- the round trip of the session preamble, fenced on attempt + lease like every write of the
-- service. Only a session whose login role may act as the task's role passes: the task's author,
-- or the service in execute_as = set_role. The state is compared as text: the row is read through
-- the primary key whatever the statistics say (see the head of queries.sql).
CREATE OR REPLACE FUNCTION {fn}(task_id bigint, task_attempt integer, task_lease uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    UPDATE {table} SET "state" = 'WORK', "start" = statement_timestamp(), "pid" = pg_backend_pid()
    WHERE "id" = task_id AND "attempt" = task_attempt AND "lease" = task_lease
      AND "state"::text IN ('TAKE', 'WORK') AND pg_has_role(session_user, "user", 'MEMBER');
    RETURN FOUND;
END
$body$

-- check --
-- A local task the claim started on an idle session the service offered (PLAN -> WORK with that
-- session's pid, see "claim" in queries.sql): that session's preamble checks, fenced like the start
-- function, that the task is still WORK on its own backend -- not STOP, not taken over -- before
-- its input runs. Only a session whose login role may act as the task's role passes.
CREATE OR REPLACE FUNCTION {fn}(task_id bigint, task_attempt integer, task_lease uuid) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    RETURN EXISTS (SELECT FROM {table} WHERE "id" = task_id AND "attempt" = task_attempt
                   AND "lease" = task_lease AND "state"::text = 'WORK' AND "pid" = pg_backend_pid()
                   AND pg_has_role(session_user, "user", 'MEMBER'));
END
$body$

-- update --
-- The state machine and the column guards, in one place:
--   "user", "group", "remote", "parent", "retried" never change;
--   the task's definition (input, plan, timing, formatting, data) changes only while PLAN or WAIT, and only
--   by a member of the task's role -- or by the running task itself (the manual's retry pattern
--   sets its own repeat to 0): its own session (the row's pid) with pg_task.id naming it, acting
--   as the task's role (pg_task.id alone can be SET by anyone);
--   "after" never changes either; a waiting task's release (WAIT -> PLAN, its plan moved to now if
--   that is later: see "release") is the service's;
--   the task's progress (state, pid, attempt, lease, start, stop, output, error, wait, waited) is written only
--   by the service -- a superuser, the table's owner, or a role provisioning registered as the
--   one an entry's service runs as ({service}) -- and the start function; anyone else may only
--   STOP a task, and only one of a role they are a member of;
--   state moves only PLAN->TAKE|WORK|GONE|STOP, WAIT->PLAN|GONE|STOP, TAKE->WORK|PLAN|DONE|FAIL,
--   WORK->DONE|FAIL|PLAN|STOP.
-- A superuser's own session is told apart first, by a setting no one can SET (is_superuser, the
-- session's role) in an expression without a query: the service's writes cost no comparison and
-- no lookup there.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    IF NEW."user" IS DISTINCT FROM OLD."user" THEN
        RAISE EXCEPTION 'column "user" of task % is immutable', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF (NEW."group", NEW."remote", NEW."parent", NEW."id", NEW."after", NEW."retried")
       IS DISTINCT FROM (OLD."group", OLD."remote", OLD."parent", OLD."id", OLD."after", OLD."retried") THEN
        RAISE EXCEPTION 'columns "id", "group", "remote", "parent", "after" and "retried" of task % are immutable', OLD.id
            USING ERRCODE = 'check_violation',
                  HINT = 'Insert a new task instead.';
    END IF;
    IF (NEW."plan", NEW."active", NEW."live", NEW."repeat", NEW."timeout", NEW."count", NEW."max",
        NEW."delete", NEW."drift", NEW."header", NEW."save", NEW."string", NEW."delimiter",
        NEW."escape", NEW."quote", NEW."input", NEW."null", NEW."data")
       IS DISTINCT FROM
       (OLD."plan", OLD."active", OLD."live", OLD."repeat", OLD."timeout", OLD."count", OLD."max",
        OLD."delete", OLD."drift", OLD."header", OLD."save", OLD."string", OLD."delimiter",
        OLD."escape", OLD."quote", OLD."input", OLD."null", OLD."data")
       AND NOT (OLD."state"::text = 'WAIT' AND NEW."state"::text = 'PLAN' AND {is_service}(current_user)) THEN
        IF coalesce(current_setting('pg_task.id', true), '') = OLD.id::text AND OLD."state" = 'WORK'
           AND OLD."pid" = pg_backend_pid() AND pg_has_role(current_user, OLD."user", 'MEMBER') THEN
            NULL;  -- the running task editing its own row
        ELSIF OLD."state"::text NOT IN ('PLAN', 'WAIT') THEN
            RAISE EXCEPTION 'task % is % and can no longer be changed', OLD.id, OLD."state"
                USING ERRCODE = 'check_violation',
                      HINT = 'Only a task in state PLAN or WAIT can be edited.';
        ELSIF NOT coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false)
              AND (NOT EXISTS (SELECT FROM pg_roles WHERE rolname = OLD."user")
                   OR NOT pg_has_role(current_user, OLD."user", 'MEMBER')) THEN
            RAISE EXCEPTION 'permission denied to change task % of role %', OLD.id, OLD."user"
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Only members of the role a task runs as may change it.';
        END IF;
        {@definition_check}
    END IF;
    IF NOT (current_user = session_user AND current_setting('is_superuser') = 'on') THEN
        IF (NEW."state" IS DISTINCT FROM OLD."state" AND NEW."state" IS DISTINCT FROM 'STOP')
           OR (NEW."pid", NEW."attempt", NEW."lease", NEW."start", NEW."stop", NEW."output", NEW."error", NEW."wait",
               NEW."waited")
              IS DISTINCT FROM
              (OLD."pid", OLD."attempt", OLD."lease", OLD."start", OLD."stop", OLD."output", OLD."error", OLD."wait",
               OLD."waited") THEN
            IF NOT {is_service}(current_user) THEN
                RAISE EXCEPTION 'permission denied to change the progress of task %', OLD.id
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = 'state, pid, attempt, lease, start, stop, output and error are written by pgtask; '
                                 'a task is cancelled with UPDATE ... SET state = ''STOP''.';
            END IF;
        END IF;
        IF NEW."state" = 'STOP' AND OLD."state" IS DISTINCT FROM 'STOP' THEN
            IF NOT ((EXISTS (SELECT FROM pg_roles WHERE rolname = OLD."user")
                     AND pg_has_role(current_user, OLD."user", 'MEMBER'))
                    OR {is_service}(current_user)) THEN
                RAISE EXCEPTION 'permission denied to stop task % of role %', OLD.id, OLD."user"
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = 'Only members of the role a task runs as may stop it.';
            END IF;
        END IF;
    END IF;
    IF NEW."state" IS DISTINCT FROM OLD."state" AND NOT (
           (OLD."state" = 'PLAN' AND NEW."state" IN ('TAKE', 'WORK', 'GONE', 'STOP'))
        OR (OLD."state"::text = 'WAIT' AND NEW."state" IN ('PLAN', 'GONE', 'STOP'))
        OR (OLD."state" = 'TAKE' AND NEW."state" IN ('WORK', 'PLAN', 'DONE', 'FAIL'))
        OR (OLD."state" = 'WORK' AND NEW."state" IN ('DONE', 'FAIL', 'PLAN', 'STOP'))) THEN
        RAISE EXCEPTION 'invalid state transition of task %: % -> %', OLD.id, OLD."state", NEW."state"
            USING ERRCODE = 'check_violation',
                  HINT = 'Allowed: PLAN->TAKE|WORK|GONE|STOP, WAIT->PLAN|GONE|STOP, TAKE->WORK|PLAN|DONE|FAIL, '
                         'WORK->DONE|FAIL|PLAN|STOP.';
    END IF;
    RETURN NEW;
END
$body$

-- update_trigger --
CREATE TRIGGER {trigger} BEFORE UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION {fn}()

-- stop --
-- STOP on a WORK row cancels it: a local task's backend directly, and a notification tells the
-- service (which also cancels remote tasks on their server). The row stays STOP.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    IF OLD."remote" IS NULL AND OLD."pid" IS NOT NULL THEN
        PERFORM pg_cancel_backend(OLD."pid") FROM pg_stat_activity
        WHERE pid = OLD."pid" AND application_name LIKE 'pg_task %';
    END IF;
    PERFORM pg_notify({channel}, 'stop ' || NEW.id);
    RETURN NULL;
END
$body$

-- stop_trigger --
CREATE TRIGGER {trigger} AFTER UPDATE OF "state" ON {table} FOR EACH ROW
WHEN (OLD."state" = 'WORK' AND NEW."state" = 'STOP') EXECUTE FUNCTION {fn}()

-- release --
-- AFTER a task that tasks wait for ("waited") ends -- no other's end calls it -- its waiting tasks
-- count it down, in the transaction that ends it. DONE: one
-- less to wait for; at none the task is released (WAIT -> PLAN) to run at the later of its plan
-- and now (the wait does not use up its "active"). FAIL, GONE or STOP: they end GONE, naming it,
-- and so (this trigger again) do the tasks waiting on them. A release wakes the service (a hint:
-- its own finishes are quiet, see wake_up).
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    released bigint;
BEGIN
    IF NEW."state" = 'DONE' THEN
        UPDATE {table} w SET "wait" = w."wait" - 1,
            "state" = CASE WHEN w."wait" = 1 THEN 'PLAN' ELSE w."state" END,
            "plan" = CASE WHEN w."wait" = 1 THEN greatest(w."plan", statement_timestamp()) ELSE w."plan" END
        WHERE w."after" @> ARRAY[NEW."id"] AND w."wait" > 0 AND w."state"::text = 'WAIT';
    ELSE
        UPDATE {table} w SET "wait" = 0, "state" = 'GONE', "start" = statement_timestamp(),
            "stop" = statement_timestamp(), "error" = format('dependency %s ended %s', NEW."id", NEW."state")
        WHERE w."after" @> ARRAY[NEW."id"] AND w."wait" > 0 AND w."state"::text = 'WAIT';
    END IF;
    GET DIAGNOSTICS released = ROW_COUNT;
    IF released > 0 THEN
        PERFORM pg_notify({channel}, 'wake');
    END IF;
    RETURN NULL;
END
$body$

-- release_trigger --
CREATE TRIGGER {trigger} AFTER UPDATE OF "state" ON {table} FOR EACH ROW
WHEN (NEW."waited" AND OLD."state" IS DISTINCT FROM NEW."state"
      AND NEW."state"::text IN ('DONE', 'FAIL', 'GONE', 'STOP'))
EXECUTE FUNCTION {fn}()

-- dropped --
-- AFTER DELETE of a task waited for that had not ended (retention deletes only ended ones; a finish deletes
-- only a DONE one, which "release" counted already): the tasks waiting on it end GONE, as for a
-- failure, and so do theirs.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    UPDATE {table} w SET "wait" = 0, "state" = 'GONE', "start" = statement_timestamp(),
        "stop" = statement_timestamp(), "error" = format('dependency %s was deleted before it ended', OLD."id")
    WHERE w."after" @> ARRAY[OLD."id"] AND w."wait" > 0 AND w."state"::text = 'WAIT';
    RETURN NULL;
END
$body$

-- dropped_trigger --
CREATE TRIGGER {trigger} AFTER DELETE ON {table} FOR EACH ROW
WHEN (OLD."waited" AND OLD."state"::text NOT IN ('DONE', 'FAIL', 'GONE', 'STOP')) EXECUTE FUNCTION {fn}()

-- wait --
-- BEFORE INSERT, after "insert" (its name sorts first: "user" is settled): a task naming the tasks
-- it runs after ("after", ids). Each must exist and be a task of a role the new task's role is a
-- member of -- the same error either way, so that no role learns which ids another role holds. A
-- task can only name tasks that exist already: no cycle can be formed. The ids are kept sorted and
-- distinct. Those that have ended DONE are met; one that ended FAIL, GONE or STOP makes the task
-- GONE at once; the rest are counted in "wait", and the task waits (WAIT: no index the claim reads
-- holds it) until "release" counts them down. The unfinished ones are locked until this
-- transaction ends -- a finish of one of them waits for it, and so sees this row (a finish that
-- committed first is seen here); inserts naming the same unfinished task take turns -- and marked
-- "waited": only their ends run "release".
-- Only a PLAN row waits: one inserted STOP is held back for good.
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    named bigint[];
    missing bigint;
    ended record;
    open integer;
BEGIN
    NEW."wait" := NULL;
    NEW."waited" := NULL;
    IF NEW."after" IS NULL THEN
        RETURN NEW;
    END IF;
    IF array_ndims(NEW."after") > 1 OR array_position(NEW."after", NULL) IS NOT NULL
       OR cardinality(NEW."after") > 10000 THEN
        RAISE EXCEPTION 'invalid after of task: a list of at most 10000 task ids without NULL'
            USING ERRCODE = 'check_violation', HINT = 'after names the ids of tasks, e.g. ARRAY[41, 42].';
    END IF;
    SELECT coalesce(array_agg(DISTINCT d ORDER BY d), '{{}}') INTO named FROM unnest(NEW."after") d;
    NEW."after" := named;
    SELECT min(d) INTO missing FROM unnest(named) d
    WHERE NOT EXISTS (SELECT FROM {table} t JOIN pg_roles r ON r.rolname = t."user"
                      WHERE t."id" = d AND pg_has_role(NEW."user", r.oid, 'MEMBER'));
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'task % named in after does not exist, or is not a task of role %', missing, NEW."user"
            USING ERRCODE = 'foreign_key_violation',
                  DETAIL = 'It never existed, or it ended and was deleted -- or it runs as a role that '
                           'the new task''s role is not a member of.',
                  HINT = 'A task can only run after existing tasks of its own role.';
    END IF;
    -- locked in id order, as strongly as the mark's update (no upgrade to deadlock on)
    PERFORM FROM {table} t WHERE t."id" = ANY(named)
        AND t."state"::text NOT IN ('DONE', 'FAIL', 'GONE', 'STOP') ORDER BY t."id" FOR NO KEY UPDATE OF t;
    UPDATE {table} t SET "waited" = true WHERE t."id" = ANY(named) AND t."waited" IS NOT TRUE
        AND t."state"::text NOT IN ('DONE', 'FAIL', 'GONE', 'STOP');
    SELECT t."id", t."state" INTO ended FROM {table} t WHERE t."id" = ANY(named)
        AND t."state"::text IN ('FAIL', 'GONE', 'STOP') ORDER BY t."id" LIMIT 1;
    SELECT count(*) INTO open FROM {table} t WHERE t."id" = ANY(named)
        AND t."state"::text NOT IN ('DONE', 'FAIL', 'GONE', 'STOP');
    IF NEW."state"::text <> 'PLAN' THEN
        RETURN NEW;
    ELSIF ended."id" IS NOT NULL THEN
        NEW."state" := 'GONE';
        NEW."start" := statement_timestamp();
        NEW."stop" := statement_timestamp();
        NEW."error" := format('dependency %s ended %s', ended."id", ended."state");
    ELSIF open > 0 THEN
        NEW."state" := 'WAIT';
        NEW."wait" := open;
    END IF;
    RETURN NEW;
END
$body$

-- wait_trigger --
-- Called only for a row that names tasks or sets the columns it keeps (a plain insert pays no call).
CREATE TRIGGER {trigger} BEFORE INSERT ON {table} FOR EACH ROW
WHEN (NEW."after" IS NOT NULL OR NEW."wait" IS NOT NULL OR NEW."waited" IS NOT NULL)
EXECUTE FUNCTION {fn}()
