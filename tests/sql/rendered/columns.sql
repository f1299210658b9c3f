-- Every live column except those a repeat sets itself (the manual's task_columns()), the
-- dependencies (the next occurrence waits for nothing) and the retry count (it is a run of its own).
SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
WHERE attrelid = %(oid)s::oid AND attnum > 0 AND NOT attisdropped AND attname NOT IN (-- (Part of columns, and of retry_policy in schedule.sql: a retry copies what a repeat copies.)
'id', 'plan', 'parent', 'start', 'stop', 'pid', 'state', 'error', 'output', 'attempt', 'lease',
'after', 'wait', 'waited', 'retried')
