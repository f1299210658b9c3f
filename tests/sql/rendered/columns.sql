-- Every live column except those a repeat sets itself (the manual's task_columns()) and the
-- dependencies: the next occurrence waits for nothing.
SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
WHERE attrelid = %(oid)s::oid AND attnum > 0 AND NOT attisdropped
  AND attname NOT IN ('id', 'plan', 'parent', 'start', 'stop', 'pid', 'state', 'error', 'output',
                      'attempt', 'lease', 'after', 'wait', 'waited')
