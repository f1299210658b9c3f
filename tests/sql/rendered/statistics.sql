PREPARE "pgtask_statistics" AS -- Whether the planner's statistics describe the queue, looked at before claiming starts after an
-- empty pass: the PLAN rows they count -- the table's row count times the frequency of PLAN among
-- the state column's most common values (0 when PLAN is not one of them, or when the table was
-- never analyzed: its partial indexes, built empty, then count no row either) -- and the due PLAN
-- rows there are now, counted up to $2. No row when this role may not analyze the table
-- (only a member of its owner's role may).
SELECT greatest(c.reltuples, 0)::float8 * coalesce((
    SELECT m.f FROM pg_stats s, unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS m(v, f)
    WHERE s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = 'state' AND m.v = 'PLAN'), 0) AS planned,
    (SELECT count(*) FROM (SELECT FROM "public"."task" t WHERE t."state" = 'PLAN' AND t."plan" <= statement_timestamp()
                          LIMIT $2) d) AS due
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = $1::oid AND pg_has_role(c.relowner, 'USAGE')
