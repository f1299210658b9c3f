-- Named queries of the maintenance services (pgtask/maintenance.py). Identifiers: {table} the task
-- table, {schedule} {occurrence} {keys} its companion tables, {enqueue} the enqueue function.
-- Every time is the database's: %(now)s is NULL in service, a fixed instant in tests.

-- schedule_due --
-- Schedules to look at: new or changed ones (next_run NULL, paused or not: they get a preview)
-- and unpaused ones whose next run has come. The lock is taken per schedule, below.
SELECT "id" FROM {schedule}
WHERE ("next_run" IS NULL AND "error" IS NULL)
   OR (NOT "paused" AND "next_run" <= coalesce(%(now)s, statement_timestamp()))
ORDER BY "next_run" NULLS FIRST, "id"
LIMIT %(limit)s

-- schedule_lock --
-- One schedule, locked for this transaction; a schedule another materialiser holds is skipped,
-- and a row it already advanced no longer matches (READ COMMITTED re-checks the WHERE).
SELECT s.*, coalesce(%(now)s, statement_timestamp()) AS "now",
       (SELECT t."state"::text FROM {table} t WHERE t."id" = s."last_task") AS last_state
FROM {schedule} s
WHERE s."id" = %(id)s
  AND ((s."next_run" IS NULL AND s."error" IS NULL) OR (NOT s."paused" AND s."next_run" <= coalesce(%(now)s, statement_timestamp())))
FOR UPDATE SKIP LOCKED

-- schedule_occurrence --
-- The occurrence key: nothing is returned when this occurrence was already materialised.
INSERT INTO {occurrence} ("schedule", "scheduled_for") VALUES (%(id)s, %(at)s)
ON CONFLICT DO NOTHING RETURNING "scheduled_for"

-- schedule_enqueue --
-- The task of one occurrence: the schedule's columns, its input, plan = the occurrence, and the
-- schedule's role as the task's "user" (returned so the caller can check it was accepted).
SELECT "id" FROM {enqueue}(%(input)s, NULL,
        %(columns)s::jsonb || jsonb_build_object('plan', %(at)s::timestamptz, 'user', %(user)s::text))

-- schedule_task_user --
SELECT "user" FROM {table} WHERE "id" = %(task)s

-- schedule_occurrence_task --
UPDATE {occurrence} SET "task" = %(task)s WHERE "schedule" = %(id)s AND "scheduled_for" = %(at)s

-- schedule_advance --
-- Advance the cursor; in the same transaction as the inserts above.
UPDATE {schedule} SET "cursor" = %(cursor)s, "next_run" = %(next_run)s, "preview" = %(preview)s,
    "last_task" = %(last_task)s, "error" = %(error)s
WHERE "id" = %(id)s

-- schedule_error --
-- A schedule that cannot be evaluated: it waits (next_run NULL, error set) until its row is changed.
UPDATE {schedule} SET "error" = %(error)s, "next_run" = NULL, "preview" = NULL
WHERE "id" = %(id)s

-- schedule_note --
-- A schedule whose materialisation failed this pass keeps its cursor; only the reason is noted.
UPDATE {schedule} SET "error" = %(error)s WHERE "id" = %(id)s AND "error" IS DISTINCT FROM %(error)s

-- schedule_next_due --
-- Seconds until the next unpaused schedule is due (NULL: none), so the loop can sleep exactly.
SELECT extract(epoch FROM min("next_run") - statement_timestamp())::float8 AS seconds
FROM {schedule} WHERE NOT "paused"

-- retention_delete --
-- One bounded batch of finished rows older than the retention:
--   old: DONE, FAIL, GONE or STOP and among the states given (the service gives all four; the
--     maintenance notebook runs this same statement as its purge_batch, with its purge_states),
--     stopped (never claimed: planned) before the cutoff. A row that ran is old by its stop alone:
--     a STOP row whose task has not ended yet (a pid, no stop) holds its group's slot and is
--     never old, however old its plan;
--   deleted: old rows none of whose children is anything but old. A row whose child is still
--     queued, running, recent or in a state not given stays, so a recurring task keeps the run
--     that is its pending run's parent, and the runs younger than the retention: not its whole
--     history (each run is the parent of the next), which a rule over all descendants would keep
--     while it repeats, and a batch of such rows would delete nothing.
-- Newest first: a child (inserted by its parent's run, so with a higher id) goes in the same batch
-- as its parent or an earlier one. A row retention keeps may thus name a parent it deleted (as
-- the manual's "delete" leaves them): "parent" is a record of who inserted the row, not a key.
WITH cutoff AS (
    SELECT coalesce(%(now)s, statement_timestamp()) - %(retention)s::interval AS at
), candidate AS (
    SELECT t."id" FROM {table} t, cutoff
    WHERE {@retention_deletable}
    ORDER BY t."id" DESC
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
)
DELETE FROM {table} t USING candidate d WHERE t."id" = d."id"

-- retention_deletable --
-- (Part of retention_delete and retention_purgeable: rows t, the cutoff's time as cutoff.at.) The
-- rows retention deletes: old, none of whose children is anything but old.
t."state" IN ('DONE', 'FAIL', 'GONE', 'STOP') AND t."state"::text = ANY(%(states)s)
      AND coalesce(t."stop", CASE WHEN t."pid" IS NULL THEN t."plan" END) < cutoff.at
      AND NOT EXISTS (SELECT FROM {table} c WHERE c."parent" = t."id"
                      AND (c."state" IN ('DONE', 'FAIL', 'GONE', 'STOP')
                           AND c."state"::text = ANY(%(states)s)
                           AND coalesce(c."stop", CASE WHEN c."pid" IS NULL THEN c."plan" END) < cutoff.at) IS NOT TRUE)

-- retention_purgeable --
-- What retention_delete deletes when its batches run until one deletes nothing, counted by state
-- (the maintenance notebook's preview of its purge). The others wait: those with a child queued,
-- running, recent or in a state not given. Deleting a batch never makes another row deletable (it
-- only removes old children), so this is exact but for rows that change meanwhile.
WITH cutoff AS (
    SELECT coalesce(%(now)s, statement_timestamp()) - %(retention)s::interval AS at
)
SELECT t."state"::text AS "state", count(*) AS "tasks", min(t."stop") AS "oldest_stop",
       max(t."stop") AS "newest_stop"
FROM {table} t, cutoff
WHERE {@retention_deletable}
GROUP BY 1 ORDER BY 1

-- keys_expire --
-- One bounded batch of expired idempotency reservations whose task is no longer queued or running
-- (its history may be long gone: that does not matter).
DELETE FROM {keys} k WHERE (k."user", k."key") IN (
    SELECT r."user", r."key" FROM {keys} r
    WHERE r."expires" <= coalesce(%(now)s, statement_timestamp())
      AND NOT EXISTS (SELECT FROM {table} t WHERE t."id" = r."task" AND t."state"::text IN ('PLAN', 'TAKE', 'WORK'))
    ORDER BY r."expires"
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED)

-- occurrences_expire --
-- Occurrence keys only guard the cursor: those a day behind it, or of deleted schedules, go.
DELETE FROM {occurrence} o WHERE ("schedule", "scheduled_for") IN (
    SELECT x."schedule", x."scheduled_for" FROM {occurrence} x
    LEFT JOIN {schedule} s ON s."id" = x."schedule"
    WHERE s."id" IS NULL OR x."scheduled_for" < s."cursor" - '1 day'::interval
    LIMIT %(limit)s
    FOR UPDATE OF x SKIP LOCKED)
