-- The rows holding their group's slot under this instance's claims (their lease begins with its
-- token): (id, attempt, lease). Those it does not run are lost to it (see claim.Claimer.reset_own).
SELECT t."id", t."attempt", t."lease"::text AS "lease" FROM "public"."task" t
WHERE (-- (Included: the slot index's predicate, and the claim's count and the orphan check, which must
-- write it as the index does for the planner to use the index.) A row holding its group's slot.
"state" IN ('TAKE', 'WORK') OR ("state" = 'STOP' AND "stop" IS NULL AND "pid" IS NOT NULL)) AND left(t."lease"::text, 18) = %(token)s AND -- (Part of claim, claim_next and reset.) The table the service knows (its oid) is the one of this
-- name now. A table dropped and provisioned again is another table, with other columns and another
-- channel: a service still holding the old oid neither claims nor resets its rows until it has
-- taken the new table up (see "next" and scheduler.Scheduler.adopt_table).
%(oid)s::oid = to_regclass('"public"."task"')
