-- Named queries of the scheduler. {table} is the quoted schema.table; %(name)s are parameters.
-- Every time is the database's (statement_timestamp()), never the service's clock.
-- A claimed row carries attempt + lease; every later write is fenced on both.
-- A row found by its id (or a batch by theirs: id = ANY) compares its state as text: the primary
-- key is then the only index that can serve the statement, whatever the statistics say. Analyzed
-- while nothing ran (autovacuum on an idle queue, or the service as a burst starts), they count no
-- TAKE/WORK row, and the planner read a task's row through the running or state index -- every
-- running row for each start and finish (5.8 ms a start with 1,000 running instead of 1) -- or
-- merge-joined a batch with the whole table read in id order.

-- claim_lock --
-- Claims of all service instances on one table take turns (group counts stay exact): on the lock of
-- a table only the service may lock (see liveness.sql). The mode conflicts with itself, and with
-- nothing a role without privileges on that table can hold -- a statement another role PREPAREs
-- keeps at most ROW EXCLUSIVE. No transaction id, no WAL: an idle pass stays as cheap as it was.
LOCK TABLE {rel_claim} IN SHARE UPDATE EXCLUSIVE MODE

-- expire --
-- Due rows past plan + active become GONE (repeating and pausing rows never expire). Run at most
-- once per pg_task.sleep, not on every claim: it reads every due row; the claim skips expired rows.
-- "active" > 0 (a CHECK constraint), so an expired row is a due one: the plan index serves it.
-- Wherever a due row's plan + active is computed, active is capped at 100,000 years: a larger one
-- (a user's) would overflow the timestamp and fail every claim.
-- A row someone else holds locked (a user's open transaction) is skipped, not waited for: the claim
-- pass must not wait on it; it expires in a later pass.
WITH e AS (
    SELECT "id" FROM {table}
    WHERE "state" = 'PLAN' AND "plan" <= statement_timestamp()
      AND "plan" + least("active", interval '100000 years') <= statement_timestamp()
      AND "repeat" = '0 sec' AND "max" >= 0
    FOR UPDATE SKIP LOCKED
)
UPDATE {table} t SET "state" = 'GONE', "start" = statement_timestamp(), "stop" = statement_timestamp(),
    "error" = 'ERROR:  task not active'
FROM e WHERE t."id" = e."id"
RETURNING t."id"

-- claim --
-- Claim due PLAN rows by remaining group capacity, then id (the manual's order): a group
-- (group + remote) runs max + 1 tasks at once; a negative max runs it one at a time. A task holds
-- its group's slot while TAKE or WORK, and once set to STOP while running (it has a pid) until its
-- task has ended (its stop is written: the finish, "stopped", or the reset): a stopped query can
-- take a while to cancel, or ignore the cancel, and the next task must not start beside it.
-- Bounded by the groups, not by the backlog: the distinct groups with PLAN rows are found by a skip
-- scan of the group index, and each group reads (and row-locks, skipping rows others hold) only the
-- head of its queue -- as many rows as it has room for -- in (max, id) order from the same index.
-- A group whose queue head is mostly far-future rows is read through the plan index instead (the
-- planner's choice; the control session turns bitmap scans off so that the ordered walk is chosen
-- when the head is due). The empty remote and no remote share one walk; each keeps its own count.
-- The lease begins with the claiming instance's token (%(token)s, registered in the instance table):
-- while that instance's control backend is connected, nobody resets the row (see "alive").
WITH RECURSIVE keys AS (
    -- each probe's first entry is its group's highest max (the index order): the group's capacity
    (SELECT t."group" AS g, coalesce(t."remote", '') AS r, greatest(t."max", 0) AS gmax FROM {table} t
     WHERE t."state" = 'PLAN' ORDER BY 1, 2, 3 DESC LIMIT 1)
    UNION ALL
    SELECT n.g, n.r, n.gmax FROM keys k, LATERAL (
        SELECT t."group" AS g, coalesce(t."remote", '') AS r, greatest(t."max", 0) AS gmax FROM {table} t
        WHERE t."state" = 'PLAN' AND (t."group", coalesce(t."remote", '')) > (k.g, k.r)
        ORDER BY 1, 2, 3 DESC LIMIT 1) n
), running AS (
    -- the predicate of the slot index (table.sql), included: the index serves the count
    SELECT "group" AS g, "remote" AS r, count(*) AS n FROM {table}
    WHERE {@table.sql:slot_held}
    GROUP BY 1, 2
), flow AS (
    -- groups paused or rate-limited (see "flow"): how many tasks each may start in this pass
    {@flow}
), heads AS (
    SELECT k.g, k.r, least(greatest(k.gmax - coalesce(sum(run.n), 0) + 1, 0), min(f.allow)) AS room
    FROM keys k LEFT JOIN running run ON run.g = k.g AND coalesce(run.r, '') = k.r
    LEFT JOIN flow f ON f.g = k.g
    GROUP BY k.g, k.r, k.gmax
), locked AS (
    SELECT c."id", greatest(c."max", 0) - coalesce(run.n, 0) AS cap, c."group", c."remote", c."user"
    FROM heads k CROSS JOIN LATERAL (
        SELECT t."id", t."group", t."remote", t."max", t."user" FROM {table} t
        WHERE t."state" = 'PLAN' AND t."group" = k.g AND coalesce(t."remote", '') = k.r
          AND t."plan" <= statement_timestamp()
          AND (t."plan" + least(t."active", interval '100000 years') > statement_timestamp()
               OR t."repeat" > '0 sec' OR t."max" < 0)
        ORDER BY greatest(t."max", 0) DESC, t."id"
        LIMIT k.room
        FOR UPDATE OF t SKIP LOCKED) c
    LEFT JOIN running run ON run.g = c."group" AND run.r IS NOT DISTINCT FROM c."remote"
    WHERE k.room > 0
), ranked AS (
    -- gk: a rate-limited group's remotes share its allowance (counting the rows of a remote past its
    -- room too: the cut can only be stricter than the allowance, never looser)
    SELECT "id", cap, cap - row_number() OVER (PARTITION BY "group", "remote" ORDER BY cap DESC, "id") + 1 AS k,
           row_number() OVER (PARTITION BY "group" ORDER BY cap DESC, "id") AS gk, "group", "remote", "user"
    FROM locked
), chosen AS (
    SELECT e."id", e."group", e."remote", e."user" FROM ranked e LEFT JOIN flow f ON f.g = e."group"
    WHERE e.k >= 0 AND {@flow_allows} AND {@same_table} ORDER BY e.cap DESC, e."id" LIMIT %(limit)s
), spent AS (
    {@spend}
), offered AS (
    -- Idle executor sessions the service offers, each (its pid, the task it ran, which this
    -- transaction finished): a chosen local task of that task's role and group takes one and goes
    -- straight to WORK, started on that session's backend (its preamble then only checks it: the
    -- table's check function).
    -- Read by their ids, each one's pid at its id's position (see flush_finished).
    SELECT (%(offer_pid)s::int4[])[o.i] AS pid, f."user", f."group",
           row_number() OVER (PARTITION BY f."user", f."group" ORDER BY o.i) AS n
    FROM {table} f, LATERAL (SELECT array_position(%(offer_id)s::bigint[], f."id") AS i) o
    WHERE f."id" = ANY(%(offer_id)s::bigint[])
), matched AS MATERIALIZED (
    -- computed once: inlined, it ran again for every chosen row (the generic plan's nested loop),
    -- ~16 x 16 sorts and joins in a 16-group pass (about a quarter of the claim statement's time)
    SELECT c."id", o.pid FROM (
        SELECT "id", "user", "group", row_number() OVER (PARTITION BY "user", "group" ORDER BY "id") AS n
        FROM chosen WHERE "remote" IS NULL) c
    JOIN offered o ON o."user" = c."user" AND o."group" = c."group" AND o.n = c.n
)
UPDATE {table} t SET "state" = CASE WHEN m.pid IS NULL THEN 'TAKE'::{state} ELSE 'WORK'::{state} END,
    "attempt" = t."attempt" + 1, "lease" = {@lease}, "pid" = m.pid,
    "start" = CASE WHEN m.pid IS NULL THEN t."start" ELSE statement_timestamp() END
FROM chosen LEFT JOIN matched m ON m."id" = chosen."id" WHERE t."id" = chosen."id"
RETURNING {task_columns}, m.pid AS session_pid

-- claim_plain --
-- The claim while no group is paused or rate-limited (next's "limited": the service claims with this
-- one after a pass found none, see claim.Claimer.claim_pass). "claim" plans and runs its flow joins
-- and its token update whatever the groups are; this one reads the group table only to check, in
-- its own snapshot, that no group is limited -- if one has become so since, it claims nothing at
-- all, the pass's "next" says so, and the pass after it claims with "claim".
{@claim flow=no_flow flow_allows=unlimited spend=no_spend}

-- flow --
-- (Part of claim.) Per group with a row in the group table that is paused or has a rate: "allow",
-- the tasks it may start now (NULL: no limit), and "avail", its rate's tokens now (NULL: no rate).
-- A token bucket in database time: tokens accrue at "rate" a second since "refilled", up to
-- "burst". The row of a rate-limited group is locked for the claim's update of its tokens --
-- skipping a row someone else holds (a user's open UPDATE of it): that group starts nothing in
-- this pass, and no other group's claim waits for it.
SELECT g."group" AS g,
       CASE WHEN g."paused" OR h."group" IS NULL THEN 0 ELSE floor(h.avail) END AS allow, h.avail
FROM {rel_group} g LEFT JOIN (
    SELECT b."group", least(b."burst", b."tokens"::numeric + b."rate" * greatest(
               extract(epoch FROM statement_timestamp() - b."refilled"), 0)) AS avail
    FROM {rel_group} b WHERE b."rate" IS NOT NULL AND NOT b."paused"
    FOR NO KEY UPDATE OF b SKIP LOCKED) h ON h."group" = g."group"
WHERE g."paused" OR g."rate" IS NOT NULL

-- flow_allows --
-- (Part of claim: a chosen row e, its group's flow f.) Within its group's allowance.
(f.allow IS NULL OR e.gk <= f.allow)

-- spend --
-- (Part of claim.) The tokens the started tasks took: the bucket as it is now, less them.
UPDATE {rel_group} g SET "tokens" = (f.avail - c.n)::float8, "refilled" = statement_timestamp()
FROM (SELECT "group", count(*) AS n FROM chosen GROUP BY 1) c, flow f
WHERE g."group" = c."group" AND f.g = c."group" AND f.avail IS NOT NULL

-- limited --
-- (Part of claim_plain and next.) Some group is paused or rate-limited.
EXISTS (SELECT FROM {rel_group} g WHERE g."paused" OR g."rate" IS NOT NULL)

-- no_flow --
-- (Part of claim_plain.) No group's flow to join.
SELECT NULL::text AS g, NULL::numeric AS allow, NULL::numeric AS avail WHERE false

-- unlimited --
-- (Part of claim_plain.) A one-time filter: every chosen row, or none at all.
NOT {@limited}

-- no_spend --
-- (Part of claim_plain.) No tokens to take.
SELECT WHERE false

-- claim_next --
-- Executor reuse within count/live (the manual's task_live): the next due task of the same group,
-- with max >= the max of the task that started this executor -- and of the same role: a session
-- is its author's (it logged in as that role, or passed that role's remote password rule).
WITH s AS (
    SELECT "id" FROM {table} t
    WHERE "state" = 'PLAN' AND "plan" <= statement_timestamp() AND "group" = %(group)s
      AND "remote" IS NOT DISTINCT FROM %(remote)s AND "max" >= %(max)s AND "user" = %(user)s
      AND {@same_table}
      AND ("plan" + least("active", interval '100000 years') > statement_timestamp()
           OR "repeat" > '0 sec' OR "max" < 0)
      AND CASE WHEN "count" > 0 AND "live" > '0 sec'
               THEN "count" > %(done)s AND %(born)s::timestamptz + least("live", interval '100000 years') > statement_timestamp()
               ELSE "count" > %(done)s OR %(born)s::timestamptz + least("live", interval '100000 years')
                    > statement_timestamp() END
      -- a paused or rate-limited group's tasks start through the claim (it keeps the count)
      AND NOT EXISTS (SELECT FROM {rel_group} g WHERE g."group" = %(group)s AND (g."paused" OR g."rate" IS NOT NULL))
    ORDER BY "max" DESC, "id" LIMIT 1
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE {table} t SET "state" = 'TAKE', "attempt" = t."attempt" + 1, "lease" = {@lease}
FROM s WHERE t."id" = s."id"
RETURNING {task_columns}, ({@settings_mark}) AS settings_mark

-- work --
UPDATE {table} SET "state" = 'WORK', "start" = statement_timestamp(), "pid" = %(pid)s
WHERE "id" = %(id)s AND "attempt" = %(attempt)s AND "lease" = %(lease)s AND "state"::text IN ('TAKE', 'WORK')
RETURNING "id"

-- finish --
-- DONE or FAIL; a row set to STOP while running stays STOP.
UPDATE {table} SET "state" = CASE WHEN "state" = 'STOP' THEN "state"
                                  WHEN %(error)s::text IS NULL THEN 'DONE' ELSE 'FAIL' END,
    "stop" = statement_timestamp(), "output" = %(output)s, "error" = %(error)s
WHERE "id" = %(id)s AND "attempt" = %(attempt)s AND "lease" = %(lease)s
  AND "state"::text IN ('TAKE', 'WORK', 'STOP')
RETURNING "state"

-- finish_repeat --
-- The next occurrence: on the plan grid (the first plan + k * repeat after now), or from the stop
-- time with drift. A STOP row is not repeated. User-added columns are copied.
INSERT INTO {table} ("parent", "plan", {copy_columns})
SELECT t."id", CASE WHEN t."drift" THEN t."stop" + t."repeat" ELSE {@next_on_grid} END, {copy_columns_t}
FROM {table} t, LATERAL (SELECT t."plan" AS p, t."repeat" AS r) g
WHERE t."id" = %(id)s AND t."attempt" = %(attempt)s AND t."lease" = %(lease)s
  AND t."state"::text IN ('DONE', 'FAIL') AND t."repeat" > '0 sec'

-- next_on_grid --
-- (Part of finish_repeat, flush and finish_pause: a grid g of p, its origin, and r, its step.) The
-- first p + k * r after now (k >= 1), at the same cost however far p lies behind: k is estimated
-- from the microseconds between p and now (a month counted as the Gregorian calendar's average,
-- 30.436875 days), and only the points that can be the first are computed, exactly as PostgreSQL
-- adds an interval (months, then days in the time zone, then microseconds: no floating point).
-- A step of microseconds only is exact: one point. Calendar months stray from their average by a
-- few days, and days from 24 hours by the time zone's changes of offset: the points within 8
-- (months) or 2 (days) days of the estimate. (r has no negative part and is at most 100,000 years,
-- p is finite: the insert and update triggers see to it -- so no point computed overflows.)
(SELECT min(c.at) FROM (
    SELECT g.p + make_interval(months => (k * e.mon)::int, days => (k * e.day)::int,
                               hours => div(k * e.us, 3600000000)::int,
                               secs => mod(k * e.us, 3600000000) / 1000000.0) AS at
    FROM (SELECT m.mon, m.day, m.us, m.mon * 2629746000000 + m.day * 86400000000 + m.us AS step,
                 (extract(epoch FROM statement_timestamp()) - extract(epoch FROM g.p)) * 1000000 AS d,
                 CASE WHEN m.mon > 0 THEN 691200000000 WHEN m.day > 0 THEN 172800000000 ELSE 0 END AS off
          FROM (SELECT extract(year FROM g.r) * 12 + extract(month FROM g.r) AS mon,
                       extract(day FROM g.r) AS day,
                       extract(epoch FROM g.r - date_trunc('day', g.r)) * 1000000 AS us) m) e,
         generate_series(greatest(div(e.d - e.off, e.step) + 1, 1)::bigint,
                         greatest(div(e.d + e.off, e.step) + 1, 1)::bigint) AS k) c
 WHERE c.at > statement_timestamp())

-- finish_delete --
DELETE FROM {table} WHERE "id" = %(id)s AND "attempt" = %(attempt)s AND "lease" = %(lease)s
  AND "state"::text = 'DONE' AND "delete" AND "output" IS NULL AND "error" IS NULL

-- finish_pause --
-- Negative max: push the group's other due rows |max| ms ahead (on their own grid unless drift).
-- (max / -1000.0: -max overflows the integer at the least max there is)
UPDATE {table} t SET "plan" = (
    SELECT CASE WHEN t."drift" THEN statement_timestamp() + g.r ELSE {@next_on_grid} END
    FROM (SELECT t."plan" AS p, make_interval(secs => t."max" / -1000.0) AS r) g)
WHERE t."state" = 'PLAN' AND t."plan" <= statement_timestamp() AND t."max" < 0
  AND t."group" = %(group)s AND t."remote" IS NOT DISTINCT FROM %(remote)s
  AND EXISTS (SELECT FROM {table} f WHERE f."id" = %(id)s AND f."attempt" = %(attempt)s
                                      AND f."lease" = %(lease)s)

-- requeue --
-- Give a claimed task back (its executor could not finish it): back to PLAN to run again.
UPDATE {table} SET "state" = 'PLAN', "start" = NULL, "stop" = NULL, "pid" = NULL
WHERE "id" = %(id)s AND "attempt" = %(attempt)s AND "lease" = %(lease)s AND "state"::text IN ('TAKE', 'WORK')
RETURNING "id"

-- input --
-- A claimed task's input, left out of its claim for its size (see inputs.py); no row once its lease is lost.
SELECT "input" FROM {table}
WHERE "id" = %(id)s AND "attempt" = %(attempt)s AND "lease" = %(lease)s AND "state"::text IN ('TAKE', 'WORK')

-- stopped --
-- A row set to STOP whose task ended without a finish -- the STOP came before its input began, its
-- session was lost, SIGTERM's grace period cancelled it -- gets its stop: it no longer holds its
-- group's slot (see "claim"). It stays STOP: unlike "requeue", nothing runs it again.
UPDATE {table} SET "stop" = statement_timestamp()
WHERE "id" = %(id)s AND "attempt" = %(attempt)s AND "lease" = %(lease)s AND "state"::text = 'STOP'
  AND "stop" IS NULL
RETURNING "id"

-- lease --
-- (Part of claim and claim_next.) A claim's lease: the claiming instance's token (the first 18
-- characters of a uuid's text), then the rest of a fresh random uuid.
(%(token)s || substr(gen_random_uuid()::text, 19))::uuid

-- instance_alive --
-- (Part of alive and reset.) Whether the instance i's control backend is connected: its pid, of its
-- role, started when it registered (a backend_start another role's session may not see is NULL:
-- then pid and role). Only the service writes the instance table, and no other role can log in as
-- the service's: nobody else's session makes an instance look alive.
EXISTS (SELECT FROM pg_stat_activity a
        WHERE a.pid = i."pid" AND a.usesysid = i."role" AND a.datname = current_database()
          AND (a.backend_start = i."started" OR a.backend_start IS NULL))

-- alive --
-- (Part of reset, and of the notebook's "stuck".) Whether the row t, holding its group's slot, is
-- alive: the instance that claimed it (its lease's token) is connected -- or, a local WORK or STOP
-- row, its executor session (its pid) is: that session's service is alive and only lost its control
-- connection (it registers the new one when it reconnects); reset now, the task would run a second
-- time beside the first -- or, stopped, the group's next task would start beside it. (A service
-- that died takes its sessions with it: the server ends an orphaned session's query within
-- client_connection_check_interval.) That session began before its task started; where this role
-- may not see when a session began (another role's: NULL, as its backend_type), it is of the
-- task's role: a backend that took over the pid of a session gone keeps no row alive. A row with no
-- lease (no service claimed it: written by hand) is not alive: true or false, never NULL, so that
-- NOT alive finds it too.
(coalesce(left(t."lease"::text, 18) IN (SELECT i."token" FROM {rel_instance} i WHERE {@instance_alive}), false)
 OR (t."state" IN ('WORK', 'STOP') AND t."remote" IS NULL AND EXISTS (
        SELECT FROM pg_stat_activity a
        WHERE a.pid = t."pid" AND a.datname = current_database()
          AND (a.backend_start <= t."start" OR (a.backend_start IS NULL AND a.usename = t."user")))))

-- register --
-- This instance's control backend (run on it at every connect): the claims of this instance are
-- alive while it is connected.
INSERT INTO {rel_instance} ("token", "pid", "started", "role")
SELECT %(token)s, a.pid, a.backend_start, a.usesysid FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()
ON CONFLICT ("token") DO UPDATE SET "pid" = EXCLUDED."pid", "started" = EXCLUDED."started", "role" = EXCLUDED."role"

-- unregister --
DELETE FROM {rel_instance} WHERE "token" = %(token)s

-- stop_requested --
-- Of the tasks this service runs (id, attempt, lease), those whose row is STOP under that very claim:
-- a 'stop <id>' notification is only a hint (any role can send one), this is what is cancelled.
-- One row: the array of their ids.
SELECT coalesce(array_agg(x."id"), '{{}}')
FROM unnest(%(id)s::bigint[], %(attempt)s::int4[], %(lease)s::uuid[]) AS x("id", "attempt", "lease")
JOIN {table} t ON t."id" = x."id"
WHERE t."attempt" = x."attempt" AND t."lease" = x."lease" AND t."state"::text = 'STOP'

-- reset --
-- Orphans: rows holding their group's slot (see "claim") that are not alive (see "alive"): the
-- service that claimed them died. A TAKE/WORK row goes back to PLAN; a STOP row stays STOP (STOP is
-- final) and gets its stop: its task ended with its service, and it no longer holds the slot.
-- Instances whose control backend is gone are forgotten.
WITH gone AS (
    DELETE FROM {rel_instance} i WHERE NOT {@instance_alive}
), s AS (
    SELECT t."id" FROM {table} t
    WHERE ({@table.sql:slot_held}) AND {@same_table} AND NOT {@alive}
    FOR UPDATE OF t SKIP LOCKED
)
{@reset_rows}

-- reset_rows --
-- (Part of reset and reset_own.) The rows s given up: a TAKE/WORK row goes back to PLAN; a STOP
-- row stays STOP (STOP is final) and gets its stop.
UPDATE {table} t SET "state" = CASE WHEN t."state" = 'STOP' THEN t."state" ELSE 'PLAN' END,
    "start" = CASE WHEN t."state" = 'STOP' THEN t."start" END,
    "stop" = CASE WHEN t."state" = 'STOP' THEN statement_timestamp() END,
    "pid" = CASE WHEN t."state" = 'STOP' THEN t."pid" END
FROM s WHERE t."id" = s."id" RETURNING t."id", t."state"

-- own --
-- The rows holding their group's slot under this instance's claims (their lease begins with its
-- token): (id, attempt, lease). Those it does not run are lost to it (see claim.Claimer.reset_own).
SELECT t."id", t."attempt", t."lease"::text AS "lease" FROM {table} t
WHERE ({@table.sql:slot_held}) AND left(t."lease"::text, 18) = %(token)s AND {@same_table}

-- reset_own --
-- Rows of this instance's claims it does not run, each still under the claim it was seen with:
-- alive while this instance is connected, no other instance's orphan check would reset them.
WITH s AS (
    SELECT t."id" FROM {table} t
    JOIN unnest(%(id)s::bigint[], %(attempt)s::int4[], %(lease)s::uuid[]) AS x("id", "attempt", "lease")
      ON t."id" = x."id" AND t."attempt" = x."attempt" AND t."lease" = x."lease"
    WHERE ({@table.sql:slot_held})
    FOR UPDATE OF t SKIP LOCKED
)
{@reset_rows}

-- same_table --
-- (Part of claim, claim_next and reset.) The table the service knows (its oid) is the one of this
-- name now. A table dropped and provisioned again is another table, with other columns and another
-- channel: a service still holding the old oid neither claims nor resets its rows until it has
-- taken the new table up (see "next" and scheduler.Scheduler.adopt_table).
%(oid)s::oid = to_regclass({regclass})

-- settings_mark --
-- A fingerprint of the ALTER DATABASE / ALTER ROLE settings that reach a session of this database:
-- a session reads them once, when it starts, so when this moves the pooled sessions are retired
-- (SessionPool.settings_changed). One scan of a small catalog, read by statements that run anyway.
SELECT coalesce(sum(hashtext(s.setrole::text || ' ' || s.setdatabase::text || ' ' || s.setconfig::text)), 0)
FROM pg_catalog.pg_db_role_setting s
WHERE s.setdatabase IN (0, (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database()))

-- next --
-- Seconds until the next planned row or the next token of a rate-limited group that spent its
-- tokens (NULL: none; such a group is looked at once more when its token comes, whether or not
-- its tasks wait for it) and whether due rows wait (blocked by max, a pause or a rate); the
-- settings' fingerprint (settings_mark); the table's oid now (see same_table); whether some group
-- is paused or rate-limited (the next pass claims with "claim" or "claim_plain"); then when this
-- backend last read the server's configuration (a reload: the sessions' error style is read again,
-- see Session.style) and the error style in force here (remote tasks' errors). The service reads
-- the columns in this order (queries.NextInfo, named alike).
SELECT least(extract(epoch FROM (SELECT min("plan") FROM {table}
                                  WHERE "state" = 'PLAN' AND "plan" > statement_timestamp() AND isfinite("plan"))
                                 - statement_timestamp())::float8,
             {@next_token}) AS next_in,
       (SELECT min("plan") FROM {table} WHERE "state" = 'PLAN') <= statement_timestamp() AS due,
       ({@settings_mark}) AS settings_mark, to_regclass({regclass})::oid::int8 AS table_oid, {@limited} AS limited,
       pg_conf_load_time() AS conf_loaded, current_setting('log_error_verbosity') AS error_verbosity,
       current_setting('log_min_error_statement') AS min_error_statement

-- next_plain --
-- "next" of a pass that claimed with "claim_plain": no group's token to wait for.
{@next next_token=no_token}

-- next_token --
-- (Part of next.) Seconds until the next token of a rate-limited group that spent its tokens --
-- in seconds, not as a time: no refilled and rate a user wrote can overflow a timestamp.
(SELECT min(x.s) FROM (
     SELECT extract(epoch FROM g."refilled" - statement_timestamp())::float8
            + (1 - g."tokens") / g."rate"::float8 AS s FROM {rel_group} g
     WHERE g."rate" IS NOT NULL AND NOT g."paused" AND g."tokens" < 1) x
 WHERE x.s > 0)

-- no_token --
-- (Part of next_plain.)
NULL::float8

-- statistics --
-- Whether the planner's statistics describe the queue, looked at before claiming starts after an
-- empty pass: the PLAN rows they count -- the table's row count times the frequency of PLAN among
-- the state column's most common values (0 when PLAN is not one of them, or when the table was
-- never analyzed: its partial indexes, built empty, then count no row either) -- and the due PLAN
-- rows there are now, counted up to %(bound)s. No row when this role may not analyze the table
-- (only a member of its owner's role may).
SELECT greatest(c.reltuples, 0)::float8 * coalesce((
    SELECT m.f FROM pg_stats s, unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS m(v, f)
    WHERE s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = 'state' AND m.v = 'PLAN'), 0) AS planned,
    (SELECT count(*) FROM (SELECT FROM {table} t WHERE t."state" = 'PLAN' AND t."plan" <= statement_timestamp()
                          LIMIT %(bound)s) d) AS due
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = %(oid)s::oid AND pg_has_role(c.relowner, 'USAGE')

-- columns --
-- Every live column except those a repeat sets itself (the manual's task_columns()), the
-- dependencies (the next occurrence waits for nothing) and the retry count (it is a run of its own).
SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
WHERE attrelid = %(oid)s::oid AND attnum > 0 AND NOT attisdropped AND attname NOT IN ({@not_copied})

-- not_copied --
-- (Part of columns, and of retry_policy in schedule.sql: a retry copies what a repeat copies.)
'id', 'plan', 'parent', 'start', 'stop', 'pid', 'state', 'error', 'output', 'attempt', 'lease',
'after', 'wait', 'waited', 'retried'

-- flush --
-- Group commit: the TAKE -> WORK transitions and the finishes of many tasks in one statement (one
-- commit). Each row stays fenced on attempt + lease exactly as in "work" and "finish"; a finished
-- row's next repeat is inserted from the finish's own result (so a row the finish did not match is
-- never repeated). Returns the rows that matched: kind 'w' (now WORK), 'f' (finished), 'r' (repeat).
-- A failing trigger fails the whole statement: the service then writes each row on its own.
-- The statement is its own transaction; it commits without waiting for the WAL flush when it holds
-- only TAKE -> WORK transitions (%(sync)s = 'off'; see completer.Completer.flush for why that is safe). It
-- sends no wake-up notification (pgtask.quiet): the service wakes itself when it inserted a repeat.
WITH sync AS MATERIALIZED (SELECT set_config('synchronous_commit', %(sync)s, true),
                                  set_config('pgtask.quiet', 'on', true)), w AS (
    UPDATE {table} t SET "state" = 'WORK', "start" = statement_timestamp(),
        "pid" = (%(w_pid)s::int4[])[array_position(%(w_id)s::bigint[], t."id")]
    -- WORK too: a retry after a lost connection may find its own first attempt committed.
    WHERE t."id" = ANY(%(w_id)s::bigint[])
      AND t."attempt" = (%(w_attempt)s::int4[])[array_position(%(w_id)s::bigint[], t."id")]
      AND t."lease" = (%(w_lease)s::uuid[])[array_position(%(w_id)s::bigint[], t."id")]
      AND t."state"::text IN ('TAKE', 'WORK')
    RETURNING t."id"
), f AS (
    {@flush_finished}
), r AS (
    -- as finish_repeat, from the finished rows
    INSERT INTO {table} ("parent", "plan", {copy_columns})
    SELECT t."id", CASE WHEN t."drift" THEN t."stop" + t."repeat" ELSE {@next_on_grid} END, {copy_columns_t}
    FROM f t, LATERAL (SELECT t."plan" AS p, t."repeat" AS r) g
    WHERE t."state" IN ('DONE', 'FAIL') AND t."repeat" > '0 sec'
    RETURNING "id"
)
SELECT 'w' AS kind, "id" FROM w UNION ALL SELECT 'f', "id" FROM f UNION ALL SELECT 'r', "id" FROM r
UNION ALL SELECT 's', 0 FROM sync

-- flush_finish --
-- The flush of a batch of finishes only, none of which repeats (most batches): the same finish,
-- without the WORK update and the repeat insert. Empty, those two still cost their executor start-up
-- and the table's statement triggers: about 60 us of the server's CPU a flush (a quarter of it).
WITH sync AS MATERIALIZED (SELECT set_config('synchronous_commit', 'on', true),
                                  set_config('pgtask.quiet', 'on', true)), f AS (
    {@flush_finished}
)
SELECT 'f' AS kind, "id" FROM f UNION ALL SELECT 's', 0 FROM sync

-- flush_finished --
-- (Part of flush and flush_finish.) DONE or FAIL for each row of the batch that still holds its
-- lease; a row set to STOP while running stays STOP. A batch is its columns' arrays, a row's values
-- at its id's position (ids are unique in a batch): the rows are read by their ids and nothing is
-- joined (see the head of this file; joined with the arrays' unnest, the rows read by id = ANY
-- were matched to every element, a batch's size squared).
UPDATE {table} t SET "state" = CASE
        WHEN t."state" = 'STOP' THEN t."state"
        WHEN (%(f_error)s::text[])[array_position(%(f_id)s::bigint[], t."id")] IS NULL THEN 'DONE'
        ELSE 'FAIL' END,
    "stop" = statement_timestamp(),
    "output" = (%(f_output)s::text[])[array_position(%(f_id)s::bigint[], t."id")],
    "error" = (%(f_error)s::text[])[array_position(%(f_id)s::bigint[], t."id")]
WHERE t."id" = ANY(%(f_id)s::bigint[])
  AND t."attempt" = (%(f_attempt)s::int4[])[array_position(%(f_id)s::bigint[], t."id")]
  AND t."lease" = (%(f_lease)s::uuid[])[array_position(%(f_id)s::bigint[], t."id")]
  AND t."state"::text IN ('TAKE', 'WORK', 'STOP')
RETURNING t.*

-- finished_already --
-- After a finish written again on a new connection because the first one was lost before its answer
-- came: of the rows the retry did not match, those the first attempt finished (it committed) --
-- ended and still holding that attempt and lease, or gone when the finish was to delete the row.
-- One row: the array of their ids.
SELECT coalesce(array_agg(x."id"), '{{}}')
FROM unnest(%(id)s::bigint[], %(attempt)s::int4[], %(lease)s::uuid[], %(gone)s::bool[])
    AS x("id", "attempt", "lease", "gone")
LEFT JOIN {table} t ON t."id" = x."id"
WHERE CASE WHEN t."id" IS NULL THEN x."gone"
           ELSE t."attempt" = x."attempt" AND t."lease" = x."lease" AND t."state"::text IN ('DONE', 'FAIL') END

-- flush_delete --
-- As finish_delete, for the batch's finished rows without output and error.
DELETE FROM {table} t
WHERE t."id" = ANY(%(id)s::bigint[])
  AND t."attempt" = (%(attempt)s::int4[])[array_position(%(id)s::bigint[], t."id")]
  AND t."lease" = (%(lease)s::uuid[])[array_position(%(id)s::bigint[], t."id")]
  AND t."state"::text = 'DONE' AND t."delete" AND t."output" IS NULL AND t."error" IS NULL
