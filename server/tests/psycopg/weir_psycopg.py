"""What a Python application does against Weir through psycopg 3:
parameters (client- and server-side binding), a server-side cursor, COPY
in and out, and an error's SQLSTATE. Prints one line per finding;
server/tests/psycopg.rs compares them with what Postgres would give.

    python weir_psycopg.py PORT
"""
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
