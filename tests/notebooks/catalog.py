"""What a pattern may change, as one comparable value: columns, constraints, indexes, triggers,
functions and relations of a schema, plus the pattern tasks in the table."""

import psycopg


def snapshot(conn: psycopg.Connection, schema: str, table: str) -> dict:
    q = lambda text, *p: sorted(map(tuple, conn.execute(text, p).fetchall()))
    return {
        "relations": q("""SELECT c.relname, c.relkind, c.oid FROM pg_class c
            WHERE c.relnamespace = %s::regnamespace""", schema),
        "columns": q("""SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                pg_get_expr(d.adbin, d.adrelid)
            FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
            LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE c.relnamespace = %s::regnamespace AND a.attnum > 0 AND NOT a.attisdropped""", schema),
        "constraints": q("""SELECT conname, pg_get_constraintdef(oid), xmin::text FROM pg_constraint
            WHERE connamespace = %s::regnamespace""", schema),
        "triggers": q("""SELECT t.tgname, pg_get_triggerdef(t.oid), t.xmin::text FROM pg_trigger t
            JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = %s::regnamespace
            AND NOT t.tgisinternal""", schema),
        "functions": q("""SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.xmin::text
            FROM pg_proc p WHERE p.pronamespace = %s::regnamespace""", schema),
        "pattern_tasks": q(f'SELECT "id", "input", "repeat"::text FROM "{schema}"."{table}" '
                           "WHERE \"data\" LIKE 'pgtask.patterns %%' AND \"state\" IN ('PLAN', 'TAKE', 'WORK')"),
    }
