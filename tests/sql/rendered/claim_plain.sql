PREPARE "pgtask_claim_plain" AS -- The claim while no group is paused or rate-limited (next's "limited": the service claims with this
-- one after a pass found none, see claim.Claimer.claim_pass). "claim" plans and runs its flow joins
-- and its token update whatever the groups are; this one reads the group table only to check, in
-- its own snapshot, that no group is limited -- if one has become so since, it claims nothing at
-- all, the pass's "next" says so, and the pass after it claims with "claim".
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
-- The lease begins with the claiming instance's token ($1, registered in the instance table):
-- while that instance's control backend is connected, nobody resets the row (see "alive").
WITH RECURSIVE keys AS (
    -- each probe's first entry is its group's highest max (the index order): the group's capacity
    (SELECT t."group" AS g, coalesce(t."remote", '') AS r, greatest(t."max", 0) AS gmax FROM "public"."task" t
     WHERE t."state" = 'PLAN' ORDER BY 1, 2, 3 DESC LIMIT 1)
    UNION ALL
    SELECT n.g, n.r, n.gmax FROM keys k, LATERAL (
        SELECT t."group" AS g, coalesce(t."remote", '') AS r, greatest(t."max", 0) AS gmax FROM "public"."task" t
        WHERE t."state" = 'PLAN' AND (t."group", coalesce(t."remote", '')) > (k.g, k.r)
        ORDER BY 1, 2, 3 DESC LIMIT 1) n
), running AS (
    -- the predicate of the slot index (table.sql), included: the index serves the count
    SELECT "group" AS g, "remote" AS r, count(*) AS n FROM "public"."task"
    WHERE -- (Included: the slot index's predicate, and the claim's count and the orphan check, which must
-- write it as the index does for the planner to use the index.) A row holding its group's slot.
"state" IN ('TAKE', 'WORK') OR ("state" = 'STOP' AND "stop" IS NULL AND "pid" IS NOT NULL)
    GROUP BY 1, 2
), flow AS (
    -- groups paused or rate-limited (see "flow"): how many tasks each may start in this pass
    -- (Part of claim_plain.) No group's flow to join.
SELECT NULL::text AS g, NULL::numeric AS allow, NULL::numeric AS avail WHERE false
), heads AS (
    SELECT k.g, k.r, least(greatest(k.gmax - coalesce(sum(run.n), 0) + 1, 0), min(f.allow)) AS room
    FROM keys k LEFT JOIN running run ON run.g = k.g AND coalesce(run.r, '') = k.r
    LEFT JOIN flow f ON f.g = k.g
    GROUP BY k.g, k.r, k.gmax
), locked AS (
    SELECT c."id", greatest(c."max", 0) - coalesce(run.n, 0) AS cap, c."group", c."remote", c."user"
    FROM heads k CROSS JOIN LATERAL (
        SELECT t."id", t."group", t."remote", t."max", t."user" FROM "public"."task" t
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
    WHERE e.k >= 0 AND -- (Part of claim_plain.) A one-time filter: every chosen row, or none at all.
NOT -- (Part of claim_plain and next.) Some group is paused or rate-limited.
EXISTS (SELECT FROM "public"."task_group" g WHERE g."paused" OR g."rate" IS NOT NULL) AND -- (Part of claim, claim_next and reset.) The table the service knows (its oid) is the one of this
-- name now. A table dropped and provisioned again is another table, with other columns and another
-- channel: a service still holding the old oid neither claims nor resets its rows until it has
-- taken the new table up (see "next" and scheduler.Scheduler.adopt_table).
$2::oid = to_regclass('"public"."task"') ORDER BY e.cap DESC, e."id" LIMIT $3
), spent AS (
    -- (Part of claim_plain.) No tokens to take.
SELECT WHERE false
), offered AS (
    -- Idle executor sessions the service offers, each (its pid, the task it ran, which this
    -- transaction finished): a chosen local task of that task's role and group takes one and goes
    -- straight to WORK, started on that session's backend (its preamble then only checks it: the
    -- table's check function).
    -- Read by their ids, each one's pid at its id's position (see flush_finished).
    SELECT ($4::int4[])[o.i] AS pid, f."user", f."group",
           row_number() OVER (PARTITION BY f."user", f."group" ORDER BY o.i) AS n
    FROM "public"."task" f, LATERAL (SELECT array_position($5::bigint[], f."id") AS i) o
    WHERE f."id" = ANY($5::bigint[])
), matched AS MATERIALIZED (
    -- computed once: inlined, it ran again for every chosen row (the generic plan's nested loop),
    -- ~16 x 16 sorts and joins in a 16-group pass (about a quarter of the claim statement's time)
    SELECT c."id", o.pid FROM (
        SELECT "id", "user", "group", row_number() OVER (PARTITION BY "user", "group" ORDER BY "id") AS n
        FROM chosen WHERE "remote" IS NULL) c
    JOIN offered o ON o."user" = c."user" AND o."group" = c."group" AND o.n = c.n
)
UPDATE "public"."task" t SET "state" = CASE WHEN m.pid IS NULL THEN 'TAKE'::"public"."state" ELSE 'WORK'::"public"."state" END,
    "attempt" = t."attempt" + 1, "lease" = -- (Part of claim and claim_next.) A claim's lease: the claiming instance's token (the first 18
-- characters of a uuid's text), then the rest of a fresh random uuid.
($1 || substr(gen_random_uuid()::text, 19))::uuid, "pid" = m.pid,
    "start" = CASE WHEN m.pid IS NULL THEN t."start" ELSE statement_timestamp() END
FROM chosen LEFT JOIN matched m ON m."id" = chosen."id" WHERE t."id" = chosen."id"
RETURNING t."id", t."attempt", t."lease", t."group", t."remote", t."max", t."user",
    CASE WHEN octet_length(t."input") <= 65536 THEN t."input" END AS input,
    octet_length(t."input") AS input_bytes, t."repeat" > '0 sec' AS repeats,
    least(round(extract(epoch FROM t."timeout")) * 1000, 2147483647)::int4 AS timeout_ms, t."header", t."string", t."null",
    t."delimiter"::text AS delimiter, t."quote"::text AS quote, t."escape"::text AS escape, t."save",
    t."count", extract(epoch FROM t."live")::float8 AS live_s, t."delete", statement_timestamp() AS now,
    extract(epoch FROM statement_timestamp() - t."plan")::float8 AS waited, m.pid AS session_pid
