-- The settings the service's own connections to the task table's database take once connected
-- (queries.py): "planner" for every statement of the service on the task table -- never a
-- sequential scan of the table, nor a bitmap scan (it would read a group's whole backlog, see
-- "claim" in queries.sql), and no JIT (none of them runs long enough to gain from compiling; a plan
-- estimated on a large table would be compiled on every run). "control": the control connection's,
-- nothing it writes needs to wait for the WAL flush (claims, resets: see claim.Claimer.claim_pass).
-- "writers": the batched writes take their rows as arrays, and the planner's custom plans for them
-- cost more than running them (and look no better than the generic plan). Sent as they are: no
-- comments within.

-- planner --
SET enable_seqscan = off; SET enable_bitmapscan = off; SET jit = off

-- control --
{@planner}; SET synchronous_commit = off

-- writers --
{@planner}; SET plan_cache_mode = force_generic_plan
