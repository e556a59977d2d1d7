//! What the `postgres` sink and the `postgres-cdc` source both ask of a
//! PostgreSQL server: a table's columns and its primary key, from the
//! server's own catalog.

use tokio_postgres::Client;

/// A column of a PostgreSQL table.
pub(crate) struct PgColumn {
    pub name: String,
    /// As `format_type` writes it (`numeric(10,2)`).
    pub sql_type: String,
    /// Part of the primary key.
    pub key: bool,
}

/// The columns of `schema.table` in order; none if there is no such table
/// (or view: only tables are read and written).
pub(crate) async fn table_columns(
    client: &Client,
    schema: &str,
    table: &str,
) -> Result<Vec<PgColumn>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
                    coalesce(a.attnum = ANY(i.indkey), false) \
             FROM pg_attribute a \
             JOIN pg_class c ON c.oid = a.attrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary \
             WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 \
               AND NOT a.attisdropped AND c.relkind IN ('r', 'p') \
             ORDER BY a.attnum",
            &[&schema, &table],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| PgColumn {
            name: r.get(0),
            sql_type: r.get(1),
            key: r.get(2),
        })
        .collect())
}
