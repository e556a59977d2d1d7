"""What a Python application does against Weir through psycopg 3:
parameters (client- and server-side binding), a server-side cursor, COPY
in and out, and an error's SQLSTATE. Prints one line per finding;
server/tests/psycopg.rs compares them with what Postgres would give.

    python weir_psycopg.py PORT
"""
import datetime as dt
import decimal
import sys

import psycopg

port = sys.argv[1]
conninfo = f"host=127.0.0.1 port={port} user=weir dbname=weir"

with psycopg.connect(conninfo, autocommit=True) as conn:
    conn.execute(
        "CREATE TABLE py (id bigint PRIMARY KEY, name text NOT NULL, score double precision)"
    )
    # Parameters, bound by the server (psycopg's default).
    for i in range(1, 4):
        conn.execute(
            "INSERT INTO py VALUES (%s, %s, %s)", (i, f"n{i}", i * 1.5)
        )
    rows = conn.execute(
        "SELECT id, name, score FROM py WHERE id >= %s ORDER BY id", (2,)
    ).fetchall()
    print("params:", rows)
    # Parameters bound by the client.
    with psycopg.ClientCursor(conn) as cur:
        cur.execute("SELECT name FROM py WHERE name = %s", ("n1",))
        print("client-side:", cur.fetchall())

    # COPY in (rows written by psycopg), then out.
    with conn.cursor() as cur:
        with cur.copy("COPY py (id, name, score) FROM STDIN") as copy:
            copy.write_row((4, "tab\there", None))
            copy.write_row((5, "n5", 7.25))
        print("copy in:", cur.rowcount)
        out = b""
        with cur.copy("COPY (SELECT id, name FROM py WHERE id > 3 ORDER BY id) TO STDOUT") as copy:
            for data in copy:
                out += bytes(data)
        print("copy out:", out.decode())
        with cur.copy("COPY (SELECT id, score FROM py WHERE id > 3 ORDER BY id) TO STDOUT") as copy:
            print("copy rows:", list(copy.rows()))

with psycopg.connect(conninfo) as conn:
    # A named cursor is a server-side one: DECLARE in a transaction, FETCH
    # in batches.
    with conn.cursor(name="big") as cur:
        cur.itersize = 2
        cur.execute("SELECT id FROM py ORDER BY id")
        print("server-side cursor:", [r[0] for r in cur])
    conn.commit()
    try:
        conn.execute("SELECT * FROM nowhere")
    except psycopg.Error as e:
        print("error:", e.sqlstate)
        conn.rollback()
    print("after error:", conn.execute("SELECT 1").fetchone())

with psycopg.connect(conninfo) as conn:
    # Without autocommit psycopg opens a block at the first statement and
    # ends it with commit() or rollback(); conn.transaction() inside a
    # block is a savepoint.
    conn.execute("INSERT INTO py VALUES (10, 'dropped', 1)")
    conn.execute("INSERT INTO py VALUES (11, 'dropped', 1)")
    conn.rollback()
    conn.execute("INSERT INTO py VALUES (12, 'kept', 1)")
    try:
        with conn.transaction():
            conn.execute("INSERT INTO py VALUES (13, 'undone', 1)")
            raise RuntimeError("roll back to the savepoint")
    except RuntimeError:
        pass
    conn.commit()
    print(
        "transactions:",
        conn.execute("SELECT id, name FROM py WHERE id >= 10 ORDER BY id").fetchall(),
    )

# Every column type, and arrays, both ways in both formats: parameters
# sent as text (%t) and as binary (%b), results read as text and binary.
values = [
    ("boolean", True),
    ("smallint", -32768),
    ("integer", 2**31 - 1),
    ("bigint", -(2**63)),
    ("real", 1.5),
    ("double precision", -0.1),
    ("numeric(20,6)", decimal.Decimal("-123456.789")),
    ("text", 'héllo "q" \\ \t,{}'),
    ("varchar(10)", "short"),
    ("date", dt.date(1999, 12, 31)),
    ("timestamp", dt.datetime(2024, 2, 29, 23, 59, 59, 123456)),
    ("timestamptz", dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt.timezone.utc)),
    ("interval", dt.timedelta(days=-1, seconds=5, microseconds=7)),
    ("bytea", b"\x00\xff\\x"),
]
selected = values + [
    ("time", dt.time(1, 2, 3, 456)),
    ("integer[]", [1, None, 3]),
    ("text[]", ["a", "b c", None, '"q"']),
    ("double precision[]", [0.5, -2.0]),
]
with psycopg.connect(conninfo, autocommit=True) as conn:
    columns = ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(values))
    conn.execute(f"CREATE TABLE every_type (id int PRIMARY KEY, {columns})")
    for id, mark in ((1, "%t"), (2, "%b")):
        marks = ", ".join([mark] * (len(values) + 1))
        conn.execute(f"INSERT INTO every_type VALUES ({marks})", [id] + [v for _, v in values])
    for binary in (False, True):
        wrong = []
        with conn.cursor(binary=binary) as cur:
            for row in cur.execute("SELECT * FROM every_type ORDER BY id").fetchall():
                for (t, want), got in zip(values, row[1:]):
                    if got != want:
                        wrong.append(f"{t} (row {row[0]}): {got!r}")
            for mark in ("%t", "%b"):
                for t, want in selected:
                    # psycopg sends a list of str untyped, as Postgres
                    # would return it: the cast says what it is.
                    got = cur.execute(f"SELECT {mark}::{t}", [want]).fetchone()[0]
                    if got != want:
                        wrong.append(f"SELECT {mark} of {t}: {got!r}")
        print("types,", "binary" if binary else "text", "results:", wrong or "ok")

# psycopg prepares a query on the server after its fifth run, and after
# DDL it forgets what it prepared with DEALLOCATE ALL; DISCARD ALL is what
# connection pools send.
with psycopg.connect(conninfo, autocommit=True) as conn:
    conn.execute("CREATE TABLE prep (id int)")
    for i in range(7):
        conn.execute("SELECT count(*) FROM prep WHERE id <> %s", [i])
    conn.execute("DROP TABLE prep")
    conn.execute("CREATE TABLE prep (id int)")
    for i in range(7):
        conn.execute("SELECT count(*) FROM prep WHERE id <> %s", [i])
    conn.execute("DISCARD ALL")
    print("prepared, DDL, DEALLOCATE ALL, DISCARD ALL:", conn.execute("SELECT count(*) FROM prep WHERE id <> %s", [1]).fetchone())
