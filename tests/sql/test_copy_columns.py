"""The checked-in rendering (tests/sql/rendered) holds the columns a repeat copies as the service
reads them from a table pgtask provisioned: pgtask sql's default is that answer."""

from pgtask import queries, sql_print


def test_the_default_copy_columns_are_those_of_a_provisioned_table(db):
    oid = db.value("SELECT 'public.task'::regclass::oid")
    assert db.value(queries.render_query("columns", "public", "task"), {"oid": oid}) == \
        sql_print.PROVISIONED_COPY_COLUMNS
