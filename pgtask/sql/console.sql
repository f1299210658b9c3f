-- What the operators' console (pgtask/console_data.py, notebooks/console.ipynb) reads, and how it
-- calls the verbs of docs/operations.md. {table}: the task table; {fn}: one of its verbs
-- (<table>_retry, ...). A filter left empty is NULL and selects every row; the same filters go
-- to the table the console lists and to the verb an action calls, so the preview counts what
-- the table shows.

-- timeout --
-- The console's statements end after this long (a slow query cannot hang the page); for the
-- session only.
SELECT set_config('statement_timeout', %(timeout)s, false)

-- filters --
-- (Part of tasks and matching.) The rows the console's filters select, as the verbs select them
-- (verbs.sql, chosen): the age is the plan's ("older than" = planned before now minus it).
(%(state)s::text IS NULL OR t."state"::text = %(state)s::text)
  AND (%(group)s::text IS NULL OR t."group" = %(group)s::text)
  AND (%(author)s::name IS NULL OR t."user" = %(author)s::name)
  AND (%(error_has)s::text IS NULL OR strpos(t."error", %(error_has)s::text) > 0)
  AND (%(older)s::interval IS NULL OR t."plan" < statement_timestamp() - %(older)s::interval)
  AND (%(ids)s::bigint[] IS NULL OR t."id" = ANY(%(ids)s::bigint[]))

-- tasks --
-- The newest of the selected rows, for the table: the input and error cut short, the age since
-- the plan (none for a waiting child, planned at infinity).
SELECT t."id", t."group", t."user"::text AS "user", t."state"::text AS "state", t."parent",
       CASE WHEN isfinite(t."plan") THEN extract(epoch FROM statement_timestamp() - t."plan") END
           AS "age_seconds",
       left(regexp_replace(coalesce(t."error", ''), '\s+', ' ', 'g'), 120) AS "error",
       left(regexp_replace(t."input", '\s+', ' ', 'g'), 80) AS "input"
FROM {table} t
WHERE {@filters}
ORDER BY t."id" DESC
LIMIT %(limit)s

-- matching --
-- How many rows the filters select.
SELECT count(*) FROM {table} t WHERE {@filters}

-- task_verb --
-- retry, cancel or delete over the console's filters: a preview, or one batch after from_id.
SELECT "tasks", "remaining", "last_id", "sample", "new_sample"
FROM {fn}(ids => %(ids)s::bigint[], states => %(states)s::text[], group_name => %(group)s::text,
          author => %(author)s::name, error_has => %(error_has)s::text,
          plan_to => statement_timestamp() - %(older)s::interval,
          preview => %(preview)s, from_id => %(from_id)s::bigint)

-- group_verb --
-- pause or resume a group, or its preview.
SELECT "tasks", "sample", "changed" FROM {fn}(group_name => %(group)s::text, preview => %(preview)s)
