"""A task's output and error text (pgtask.output), without a cluster: the pieces and their "\\n",
quoting (spec section 7), the byte cap, decoding after an input changed the client encoding, and
the error text of failures that have no server result. Rows and server errors need a server:
tests/integration/test_output.py."""

from __future__ import annotations

import pytest
from psycopg import pq

from pgtask.output import TRUNCATED, ErrorStyle, Format, Output, format_error, simple_error

pytestmark = [pytest.mark.any_pg, pytest.mark.quick]  # no server: the first pass of ./test runs it

LIMIT = 1 << 20


def test_no_piece_is_null_and_an_empty_piece_is_empty_text():
    out = Output(Format(), LIMIT)
    assert out.value() is None
    out.piece("")  # SELECT pg_sleep(0): one row of one empty column
    assert out.value() == ""


def test_pieces_are_joined_by_newlines():
    out = Output(Format(), LIMIT)
    for piece in ("a\tb", "1\t2", "INSERT 0 1"):
        out.piece(piece)
    assert out.value() == "a\tb\n1\t2\nINSERT 0 1"


def test_an_empty_first_piece_still_has_its_line():
    """pg_task's quirk (no "\\n" after an empty first piece, spec section 7) is not copied: each
    piece is a line of its own."""
    out = Output(Format(), LIMIT)
    out.piece("")
    out.piece("1")
    assert out.value() == "\n1"


def test_copy_data_is_appended_as_is_with_nul_bytes_replaced():
    out = Output(Format(), LIMIT)
    out.raw("1\tx\n")
    out.raw("2\t\x00y\x00\n")
    assert out.value() == "1\tx\n2\t\ufffdy\ufffd\n"


def test_the_output_beside_an_error_is_empty_not_null():
    assert Output(Format(), LIMIT).outcome(None, "ERROR:  x") == ("", "ERROR:  x")
    assert Output(Format(), LIMIT).outcome(None, None) == (None, None)
    out = Output(Format(), LIMIT)
    out.piece("1")
    assert out.outcome(None, "ERROR:  x") == ("1", "ERROR:  x")


def test_output_beyond_the_limit_is_cut_and_says_so_once():
    out = Output(Format(), 10)
    out.piece("abcdefgh")
    out.piece("ijklmn")  # "\n" is the 9th character, "i" the 10th
    out.piece("more")
    out.raw("more")
    assert out.truncated and out.value() == "abcdefgh\ni\n... [output truncated at 10 characters by pgtask]"
    assert TRUNCATED.format(limit=10) == "\n... [output truncated at 10 characters by pgtask]"


def test_a_limit_of_zero_keeps_only_the_notice():
    out = Output(Format(), 0)
    out.piece("x")
    assert out.value() == "\n... [output truncated at 0 characters by pgtask]"


def test_the_limit_counts_characters():
    """docs/reference.md: output_limit is the characters of output kept (the notice's word is bytes)."""
    out = Output(Format(), 3)
    out.piece("é\U0001F600éé")
    assert out.value() == "é\U0001F600é\n... [output truncated at 3 characters by pgtask]"


def test_a_piece_exactly_at_the_limit_is_not_cut():
    out = Output(Format(), 3)
    out.piece("abc")
    assert not out.truncated and out.value() == "abc"


def test_bytes_of_another_encoding_are_read_in_the_encoding_the_input_left():
    """An input that ran SET client_encoding TO 'LATIN1': what came after is LATIN1 bytes, kept
    (surrogateescape) until the end, then read in it. é is 0xE9 in LATIN1."""
    out = Output(Format(), LIMIT, "utf-8")
    out.piece("SET")
    out.piece("caf\udce9")
    assert out.value("latin-1") == "SET\ncafé"


def test_bytes_valid_in_neither_encoding_become_the_replacement_character():
    out = Output(Format(), LIMIT, "utf-8")
    out.piece("caf\udce9")  # 0xE9 alone is no UTF-8
    assert out.value() == "caf\ufffd" and out.value("utf-8") == "caf\ufffd"


def test_what_the_starting_encoding_cannot_hold_becomes_a_question_mark():
    out = Output(Format(), LIMIT, "ascii")  # SQL_ASCII
    out.piece("caf\udce9")
    assert out.value("latin-1") == "caf?"


def test_plain_text_in_an_unchanged_encoding_is_returned_as_it_is():
    out = Output(Format(), LIMIT, "utf-8")
    out.piece("héllo \U0001F600")
    assert out.value("utf-8") == "héllo \U0001F600"


@pytest.mark.parametrize(("fmt", "value", "nonstring", "written"), [
    (Format(), 'a"b\\c', False, 'a"b\\c'),                                    # defaults: no quote
    (Format(quote='"', escape="\\"), 'a"b\\c', False, '"a\\"b\\\\c"'),        # the manual's test 15
    (Format(quote='"'), 'a"b', False, '"a"b"'),                               # no escape: as it is
    (Format(quote='"', escape="\\"), "42", True, "42"),                       # string on, a number
    (Format(quote='"', escape="\\", string=False), "42", True, '"42"'),       # string off: all quoted
    (Format(quote="'", escape="'"), "it's", False, "'it''s'"),                # escape = quote
    (Format(quote='"', escape="\\"), "", False, '""'),
])
def test_quoting(fmt, value, nonstring, written):
    assert Output(fmt, LIMIT)._quoted(value, nonstring) == written


def test_a_result_set_without_rows_adds_nothing():
    """A zero-row SELECT contributes nothing: no header, no tag, the output stays NULL."""
    conn = pq.PGconn.connect_start(b"host=/nonexistent port=1")  # never connected: only makes results
    try:
        res = conn.make_empty_result(pq.ExecStatus.TUPLES_OK)
        out = Output(Format(), LIMIT)
        out.result(res, local=True)
        assert out.value() is None
    finally:
        conn.finish()


def test_an_error_without_a_result_is_written_as_the_server_logs_it():
    assert format_error(None, "SELECT 1/0", message="division by zero") == \
        "ERROR:  division by zero\nSTATEMENT:  SELECT 1/0"
    assert format_error(None, None, message="boom") == "ERROR:  boom"
    assert format_error(None, None) == "ERROR:  unknown error"
    assert format_error(None, None, message="ERROR:  labelled already") == "ERROR:  labelled already"


def test_every_line_break_inside_a_field_is_followed_by_a_tab():
    assert format_error(None, "SELECT 1;\nSELECT 2", message="line one\nline two") == \
        "ERROR:  line one\n\tline two\nSTATEMENT:  SELECT 1;\n\tSELECT 2"


def test_a_simple_error_has_its_detail_unless_terse_and_its_statement():
    assert simple_error("PQconninfoParse failed", 'missing "=" after "x"') == \
        'ERROR:  PQconninfoParse failed\nDETAIL:  missing "=" after "x"'
    assert simple_error("refused", "why", "SELECT 1") == "ERROR:  refused\nDETAIL:  why\nSTATEMENT:  SELECT 1"
    assert simple_error("refused", "why\nand why", "SELECT 1", ErrorStyle("terse", "error")) == \
        "ERROR:  refused\nSTATEMENT:  SELECT 1"
    assert simple_error("a\nb", "c\nd") == "ERROR:  a\n\tb\nDETAIL:  c\n\td"


@pytest.mark.parametrize(("least", "severity", "written"), [
    ("error", "ERROR", True), ("error", "FATAL", True), ("error", "WARNING", False),
    ("warning", "ERROR", True), ("log", "ERROR", False),  # LOG ranks above ERROR in the server's order
    ("panic", "ERROR", False), ("panic", "PANIC", True), ("debug5", "NOTICE", True),
    ("nonsense", "ERROR", True),  # an unknown threshold is the default, error
    ("error", "nonsense", True),  # an unknown severity counts as an error
])
def test_the_statement_line_follows_log_min_error_statement(least, severity, written):
    assert ErrorStyle("default", least).statement(severity) is written


def test_a_statement_below_the_threshold_is_left_out():
    assert simple_error("x", statement="SELECT 1", style=ErrorStyle("default", "panic")) == "ERROR:  x"
    assert format_error(None, "SELECT 1", message="x", style=ErrorStyle("default", "fatal")) == "ERROR:  x"


def test_the_style_is_read_from_the_servers_settings_in_lower_case():
    assert ErrorStyle.of(("VERBOSE", "WARNING")) == ErrorStyle("verbose", "warning")
    assert ErrorStyle.of(None) == ErrorStyle("default", "error")
