-- The operator verbs beside a task table (docs/operations.md): retry, cancel and delete tasks by id
-- or by filter, pause and resume a group, each with a preview that changes nothing.
-- Placeholders (filled in by provision_verbs.py with psycopg.sql): {table} the task table, {state}
-- its enum, {groups} the group table, {fn} the function being created, {regclass} the task table
-- as a literal for ::regclass, {admin} the name of the table's operator role (literal), {verb} the
-- function a procedure loops over.
--
-- Who calls: inside a SECURITY DEFINER function current_user is the owner, so the caller is the
-- role the session acts as -- its SET ROLE, else its login role (SET ROLE is checked by the server:
-- a session can only become a role its login role is a member of; a parameter naming the caller
-- could name anyone). Authority is the table's: the caller acts on the rows of the roles it is a
-- member of ("user"); the table's operator role {admin}, the table's owner (and a superuser) on
-- every row. Filters are parameters, never spliced into a statement.

-- caller --
-- (Part of every verb.) The caller, and whether it may act on every row.
caller := coalesce(nullif(current_setting('role'), 'none'), session_user)::name;
    everyone := pg_has_role(caller, (SELECT c.relowner FROM pg_class c WHERE c.oid = {regclass}::regclass), 'USAGE')
        OR coalesce(pg_has_role(caller, (SELECT r.oid FROM pg_roles r WHERE r.rolname = {admin}), 'MEMBER'), false);

-- arguments --
-- (Part of retry, cancel and delete.) The selection's arguments, checked before anything is read:
-- a call names its tasks (ids, or at least one filter: a verb over every row is spelled out with
-- its states), states only among the verb's, a batch of a sane size; and by id, every id a task of
-- a role the caller is a member of (the same refusal for an id that does not exist, so that no
-- role learns which ids another holds), unless the caller acts on every row.
{@caller}
    IF ids IS NULL AND states IS NULL AND group_name IS NULL AND author IS NULL AND error_has IS NULL
       AND error_like IS NULL AND plan_from IS NULL AND plan_to IS NULL AND stop_from IS NULL
       AND stop_to IS NULL THEN
        RAISE EXCEPTION 'no tasks named: give ids or at least one filter' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'e.g. ids => ARRAY[41, 42], or group_name => ''g''; for every row, name the states: '
                   'states => ARRAY[' || array_to_string(ARRAY(SELECT quote_literal(a) FROM unnest(allowed) a), ', ') || '].';
    END IF;
    IF cardinality(ids) > 1000000 THEN
        RAISE EXCEPTION 'argument ids names % tasks: at most 1000000', cardinality(ids)
            USING ERRCODE = 'program_limit_exceeded', HINT = 'Select that many tasks by filter instead.';
    END IF;
    IF states IS NOT NULL AND (array_position(states, NULL) IS NOT NULL OR NOT states <@ allowed) THEN
        RAISE EXCEPTION 'argument states: % is not among %', states, allowed
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = format('This verb acts on tasks in states %s only.', array_to_string(allowed, ', '));
    END IF;
    picked := coalesce(states, allowed)::{state}[];
    IF batch IS NULL OR batch < 1 OR batch > 1000000 THEN
        RAISE EXCEPTION 'argument batch: % is not between 1 and 1000000', coalesce(batch::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'batch bounds the rows one call changes (and locks); the procedure *_all loops.';
    END IF;
    IF ids IS NOT NULL AND NOT everyone THEN
        SELECT min(d) INTO missing FROM unnest(ids) d
        WHERE d IS NOT NULL AND NOT EXISTS (
            SELECT FROM {table} t JOIN pg_roles r ON r.rolname = t."user"
            WHERE t."id" = d AND pg_has_role(caller, r.oid, 'MEMBER'));
        IF missing IS NOT NULL THEN
            RAISE EXCEPTION 'permission denied: task % does not exist or is not a task of a role % is a member of',
                missing, caller USING ERRCODE = 'insufficient_privilege',
                HINT = format('An author acts on its own tasks only; role %s acts on every task.', {admin});
        END IF;
    END IF;

-- chosen --
-- (Part of retry, cancel and delete.) The tasks a call selects, t: in the verb's states, matching
-- every filter given, the caller's own unless it acts on every row, after from_id (a batch's
-- cursor). The state is compared as the enum: the state index serves it.
t."state" = ANY(picked)
      AND (ids IS NULL OR t."id" = ANY(ids))
      AND (from_id IS NULL OR t."id" > from_id)
      AND (group_name IS NULL OR t."group" = group_name)
      AND (author IS NULL OR t."user" = author)
      AND (error_has IS NULL OR strpos(t."error", error_has) > 0)
      AND (error_like IS NULL OR t."error" ILIKE error_like)
      AND (plan_from IS NULL OR t."plan" >= plan_from) AND (plan_to IS NULL OR t."plan" < plan_to)
      AND (stop_from IS NULL OR t."stop" >= stop_from) AND (stop_to IS NULL OR t."stop" < stop_to)
      AND (everyone OR EXISTS (SELECT FROM pg_roles r WHERE r.rolname = t."user"
                                                       AND pg_has_role(caller, r.oid, 'MEMBER')))

-- ended --
-- (Part of retry and delete.) A STOP row whose task has not ended yet (a pid, no stop) still
-- holds its group's slot, as for the claim: it is neither retried nor deleted.
NOT (t."state"::text = 'STOP' AND t."stop" IS NULL AND t."pid" IS NOT NULL)

-- signature --
-- (Part of retry, cancel and delete.) The arguments; every one may be named.
ids bigint[] DEFAULT NULL, states text[] DEFAULT NULL, group_name text DEFAULT NULL,
    author name DEFAULT NULL, error_has text DEFAULT NULL, error_like text DEFAULT NULL,
    plan_from timestamptz DEFAULT NULL, plan_to timestamptz DEFAULT NULL,
    stop_from timestamptz DEFAULT NULL, stop_to timestamptz DEFAULT NULL,
    preview boolean DEFAULT false, batch integer DEFAULT 10000, from_id bigint DEFAULT NULL

-- declarations --
-- (Part of retry, cancel and delete.)
caller name;
    everyone boolean;
    missing bigint;
    picked {state}[];

-- preview --
-- (Part of retry, cancel and delete.) How many tasks the verb would act on (over all its
-- batches), the first 10 of them; nothing changes and nothing is locked.
IF preview THEN
        SELECT count(*) INTO tasks FROM {table} t WHERE {@chosen} AND {@verb_rows};
        sample := ARRAY(SELECT t."id" FROM {table} t WHERE {@chosen} AND {@verb_rows} ORDER BY t."id" LIMIT 10);
        remaining := tasks;
        RETURN NEXT;
        RETURN;
    END IF;

-- verb_rows --
-- (Swapped in the preview by each verb: the rows it acts on besides chosen.)
true

-- retry --
-- retry(ids | filters, preview, batch, from_id) -> (tasks, remaining, last_id, sample, new_sample):
-- each selected FAIL, GONE or STOP task that has ended runs again as a new row whose parent is the
-- old one: a copy of its definition (input, timing, formatting, data, user-added columns, "user":
-- it runs as its author) planned now; the old row, its error and output stay. The copy runs once
-- (repeat 0: a repeating task's series goes on from its own next row) and waits for nothing. A
-- task whose role is gone is not retried (no one to run it as). "retried" is not copied: the copy
-- starts a new chain of its group's retry policy (an operator's retry after a fix gets every
-- attempt). At most batch tasks a call, in id order, locked against a concurrent retry or delete of the same row; last_id is the cursor of the
-- next call (from_id). new_sample: the new ids of the first 10, beside them in sample.
-- The insert trigger keeps "user" for the table owner's insert under pgtask.retry (see "insert" in
-- triggers.sql); the copy is checked to have kept it.
CREATE OR REPLACE FUNCTION {fn}({@signature})
RETURNS TABLE (tasks bigint, remaining bigint, last_id bigint, sample bigint[], new_sample bigint[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    allowed text[] := ARRAY['FAIL', 'GONE', 'STOP'];
    {@declarations}
    old bigint[];
    made bigint[];
    parents bigint[];
    cols text;
    cols_o text;
    lost bigint;
BEGIN
    {@arguments}
    {@preview verb_rows=retry_rows}
    old := ARRAY(SELECT t."id" FROM {table} t WHERE {@chosen} AND {@retry_rows}
                 ORDER BY t."id" LIMIT batch FOR UPDATE OF t);
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum),
           string_agg('o.' || quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO cols, cols_o
    FROM pg_attribute a
    WHERE a.attrelid = {regclass}::regclass AND a.attnum > 0 AND NOT a.attisdropped
      AND a.attname NOT IN ('id', 'plan', 'parent', 'repeat', 'start', 'stop', 'pid', 'state', 'error',
                            'output', 'attempt', 'lease', 'after', 'wait', 'waited', 'retried');
    PERFORM set_config('pgtask.retry', 'on', true);
    EXECUTE format('WITH n AS (INSERT INTO %1$s ("parent", "plan", "repeat", %2$s) '
                   'SELECT o."id", statement_timestamp(), ''0 sec'', %3$s FROM %1$s o '
                   'WHERE o."id" = ANY($1) ORDER BY o."id" RETURNING "id", "parent", "user") '
                   'SELECT array_agg(n."id" ORDER BY n."parent"), array_agg(n."parent" ORDER BY n."parent"), '
                   'count(*) FILTER (WHERE n."user" IS DISTINCT FROM o."user") '
                   'FROM n JOIN %1$s o ON o."id" = n."parent"',
                   {regclass}::regclass, cols, cols_o)
        INTO made, parents, lost USING old;
    PERFORM set_config('pgtask.retry', '', true);
    IF lost > 0 THEN
        RAISE EXCEPTION 'retry would run % task(s) as another role than their author', lost
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'The retry function must be owned by the task table''s owner (or a member of it).';
    END IF;
    tasks := coalesce(cardinality(parents), 0);
    last_id := parents[tasks];
    sample := parents[1:10];
    new_sample := made[1:10];
    SELECT count(*) INTO remaining FROM {table} t
    WHERE {@chosen} AND {@retry_rows} AND (last_id IS NULL OR t."id" > last_id);
    RETURN NEXT;
END
$body$

-- retry_rows --
-- (Part of retry.) An ended task of a role that exists.
{@ended} AND EXISTS (SELECT FROM pg_roles r WHERE r.rolname = t."user")

-- cancel --
-- cancel(ids | filters, preview, batch) -> (tasks, remaining, last_id, sample, new_sample NULL):
-- the selected PLAN, WAIT or WORK tasks become STOP, through the update trigger's state machine
-- as a user's UPDATE ... SET state = 'STOP': a running local task's backend is cancelled, the
-- service told. A claim's moment (TAKE, which cannot become STOP) is not selected: a task being
-- claimed right then is cancelled by the next call, once it runs (WORK). At most batch tasks a
-- call; rows another transaction holds (a claim, a finish) are skipped, not waited for, and left
-- to the next call (remaining counts them).
CREATE OR REPLACE FUNCTION {fn}({@signature})
RETURNS TABLE (tasks bigint, remaining bigint, last_id bigint, sample bigint[], new_sample bigint[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    allowed text[] := ARRAY['PLAN', 'WAIT', 'WORK'];
    {@declarations}
BEGIN
    {@arguments}
    {@preview}
    WITH s AS (SELECT t."id" FROM {table} t WHERE {@chosen}
               ORDER BY t."id" LIMIT batch FOR UPDATE OF t SKIP LOCKED),
         u AS (UPDATE {table} t SET "state" = 'STOP' FROM s
               WHERE t."id" = s."id" AND t."state"::text IN ('PLAN', 'WAIT', 'WORK') RETURNING t."id")
    SELECT count(*), max(u."id"), (array_agg(u."id" ORDER BY u."id"))[1:10] INTO tasks, last_id, sample FROM u;
    SELECT count(*) INTO remaining FROM {table} t WHERE {@chosen};
    RETURN NEXT;
END
$body$

-- delete --
-- delete(ids | filters, preview, batch) -> (tasks, remaining, last_id, sample, new_sample NULL):
-- the selected DONE, FAIL, GONE or STOP tasks that have ended are deleted. At most batch tasks a
-- call; rows another transaction holds are skipped and left to the next call.
CREATE OR REPLACE FUNCTION {fn}({@signature})
RETURNS TABLE (tasks bigint, remaining bigint, last_id bigint, sample bigint[], new_sample bigint[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    allowed text[] := ARRAY['DONE', 'FAIL', 'GONE', 'STOP'];
    {@declarations}
BEGIN
    {@arguments}
    {@preview verb_rows=ended}
    WITH s AS (SELECT t."id" FROM {table} t WHERE {@chosen} AND {@ended}
               ORDER BY t."id" LIMIT batch FOR UPDATE OF t SKIP LOCKED),
         d AS (DELETE FROM {table} t USING s WHERE t."id" = s."id" RETURNING t."id")
    SELECT count(*), max(d."id"), (array_agg(d."id" ORDER BY d."id"))[1:10] INTO tasks, last_id, sample FROM d;
    SELECT count(*) INTO remaining FROM {table} t WHERE {@chosen} AND {@ended};
    RETURN NEXT;
END
$body$

-- every --
-- <verb>_all(ids | filters, batch) -> tasks, remaining: CALL it (outside a transaction block) to
-- apply the verb to every selected task in batches, committing after each: no lock is held
-- longer than one batch, and the claim goes on between them. Runs as the caller (a procedure
-- that commits cannot be SECURITY DEFINER nor SET search_path): the verb it calls checks
-- authority. Stops when nothing is left, or when a batch could act on none of what is left
-- (held by others; remaining says how many).
CREATE OR REPLACE PROCEDURE {fn}(ids bigint[] DEFAULT NULL, states text[] DEFAULT NULL,
    group_name text DEFAULT NULL, author name DEFAULT NULL, error_has text DEFAULT NULL,
    error_like text DEFAULT NULL, plan_from timestamptz DEFAULT NULL, plan_to timestamptz DEFAULT NULL,
    stop_from timestamptz DEFAULT NULL, stop_to timestamptz DEFAULT NULL, batch integer DEFAULT 10000,
    INOUT tasks bigint DEFAULT NULL, INOUT remaining bigint DEFAULT NULL)
LANGUAGE plpgsql AS $body$
DECLARE
    r record;
    cursor_id bigint;
BEGIN
    tasks := 0;
    LOOP
        SELECT * INTO r FROM {verb}(ids => ids, states => states, group_name => group_name,
            author => author, error_has => error_has, error_like => error_like, plan_from => plan_from,
            plan_to => plan_to, stop_from => stop_from, stop_to => stop_to, batch => batch,
            from_id => cursor_id);
        tasks := tasks + r.tasks;
        remaining := r.remaining;
        -- retry's rows stay selected: the next batch starts after this one's last
        cursor_id := CASE WHEN {cursor} THEN coalesce(r.last_id, cursor_id) END;
        COMMIT;
        EXIT WHEN r.remaining = 0 OR r.tasks = 0;
    END LOOP;
END
$body$

-- pause --
-- pause(group_name, preview) -> (tasks, sample, changed): the group's tasks are no longer claimed
-- (running ones finish); tasks: its queued (PLAN) tasks, sample the first 10 of them. Only for the
-- table's operator role, owner or a superuser: a pause holds every role's tasks of the group.
CREATE OR REPLACE FUNCTION {fn}(group_name text, preview boolean DEFAULT false)
RETURNS TABLE (tasks bigint, sample bigint[], changed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    {@group_declarations}
BEGIN
    {@group_check}
    IF preview THEN
        changed := NOT coalesce((SELECT g."paused" FROM {groups} g WHERE g."group" = group_name), false);
    ELSE
        INSERT INTO {groups} AS g ("group", "paused") VALUES (group_name, true)
        ON CONFLICT ("group") DO UPDATE SET "paused" = true WHERE NOT g."paused"
        RETURNING true INTO changed;
        changed := coalesce(changed, false);
    END IF;
    {@group_tasks}
END
$body$

-- resume --
-- resume(group_name, preview) -> (tasks, sample, changed): a paused group's tasks are claimed
-- again; tasks: its queued (PLAN) tasks, sample the first 10 of them. As pause, for the operator.
CREATE OR REPLACE FUNCTION {fn}(group_name text, preview boolean DEFAULT false)
RETURNS TABLE (tasks bigint, sample bigint[], changed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    {@group_declarations}
BEGIN
    {@group_check}
    IF preview THEN
        changed := coalesce((SELECT g."paused" FROM {groups} g WHERE g."group" = group_name), false);
    ELSE
        UPDATE {groups} g SET "paused" = false WHERE g."group" = group_name AND g."paused"
        RETURNING true INTO changed;
        changed := coalesce(changed, false);
    END IF;
    {@group_tasks}
END
$body$

-- group_declarations --
-- (Part of pause and resume.)
caller name;
    everyone boolean;

-- group_check --
-- (Part of pause and resume.) Only a caller that acts on every row; a group named.
{@caller}
    IF NOT everyone THEN
        RAISE EXCEPTION 'permission denied to pause or resume a group: role % is not a member of %', caller, {admin}
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('A pause holds every role''s tasks of the group: GRANT %s to the operators who may.', {admin});
    END IF;
    IF group_name IS NULL THEN
        RAISE EXCEPTION 'argument group_name is NULL' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Name the group, e.g. group_name => ''g''.';
    END IF;

-- group_tasks --
-- (Part of pause and resume.) The group's queued tasks, as the result.
SELECT count(*) INTO tasks FROM {table} t WHERE t."group" = group_name AND t."state" = 'PLAN';
    sample := ARRAY(SELECT t."id" FROM {table} t WHERE t."group" = group_name AND t."state" = 'PLAN'
                    ORDER BY t."id" LIMIT 10);
    RETURN NEXT;
