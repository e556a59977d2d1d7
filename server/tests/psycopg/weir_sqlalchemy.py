"""What Superset does when it connects: SQLAlchemy 2 with psycopg 3,
reading the catalogs through the inspector (schemas, tables, views,
materialized views, columns, keys, indexes, comments). Prints what it
finds; server/tests/psycopg.rs compares it with what Postgres gives."""

import sys

import sqlalchemy as sa

port = sys.argv[1]
engine = sa.create_engine(f"postgresql+psycopg://weir@127.0.0.1:{port}/weir")
with engine.begin() as conn:
    conn.execute(sa.text(
        "CREATE TABLE sa_orders (id int PRIMARY KEY, customer varchar(20) NOT NULL, amount numeric(10,2))"))
    conn.execute(sa.text("CREATE VIEW sa_big AS SELECT id, amount FROM sa_orders WHERE amount > 10"))
    conn.execute(sa.text(
        "CREATE MATERIALIZED VIEW sa_spend AS SELECT customer, sum(amount) AS total FROM sa_orders GROUP BY customer"))
    conn.execute(sa.text("INSERT INTO sa_orders VALUES (1, 'ann', 12.50), (2, 'bob', 3.00)"))

inspector = sa.inspect(engine)
print("schemas:", inspector.get_schema_names())
print("tables:", inspector.get_table_names(schema="public"))
print("views:", inspector.get_view_names(schema="public"))
print("materialized:", inspector.get_materialized_view_names(schema="public"))
print("columns:", [(c["name"], str(c["type"]), c["nullable"])
                   for c in inspector.get_columns("sa_orders", schema="public")])
print("view columns:", [c["name"] for c in inspector.get_columns("sa_spend", schema="public")])
print("primary key:", inspector.get_pk_constraint("sa_orders", schema="public"))
print("foreign keys:", inspector.get_foreign_keys("sa_orders", schema="public"))
print("indexes:", inspector.get_indexes("sa_orders", schema="public"))
print("unique:", inspector.get_unique_constraints("sa_orders", schema="public"))
print("comment:", inspector.get_table_comment("sa_orders", schema="public"))
print("has table:", inspector.has_table("sa_orders", schema="public"))
with engine.connect() as conn:
    rows = conn.execute(sa.text("SELECT id, customer FROM sa_orders WHERE amount > :min ORDER BY id"),
                        {"min": 5}).all()
    print("query:", [tuple(r) for r in rows])
