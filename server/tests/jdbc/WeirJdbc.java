// What a JDBC application does against Weir, through pgjdbc: connect,
// read DatabaseMetaData, run PreparedStatements with parameters and read
// ResultSetMetaData. Prints one line per finding; server/tests/jdbc.rs
// compares them with what Postgres would give. Run as a source file:
//   java -Duser.timezone=UTC -cp postgresql.jar WeirJdbc.java PORT
import java.sql.*;
import java.util.*;

public class WeirJdbc {
    static void print(String what, ResultSet rs, String... columns) throws SQLException {
        List<String> rows = new ArrayList<>();
        while (rs.next()) {
            StringJoiner j = new StringJoiner(",");
            for (String c : columns) j.add(String.valueOf(rs.getString(c)));
            rows.add(j.toString());
        }
        System.out.println(what + ": " + String.join(" | ", rows));
    }

    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.setProperty("user", "weir");
        String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/weir";
        try (Connection c = DriverManager.getConnection(url, p)) {
            DatabaseMetaData md = c.getMetaData();
            System.out.println("product: " + md.getDatabaseProductName());
            try (Statement s = c.createStatement()) {
                s.execute("CREATE TABLE jt (id bigint PRIMARY KEY, name varchar(20) NOT NULL, price numeric(8,2), seen timestamptz)");
                s.execute("CREATE MATERIALIZED VIEW jv AS SELECT name, count(*) AS n FROM jt GROUP BY name");
            }
            print("schemas", md.getSchemas(), "TABLE_SCHEM");
            print("tables", md.getTables(null, "public", "%", null), "TABLE_NAME", "TABLE_TYPE");
            print("columns", md.getColumns(null, "public", "jt", null),
                "COLUMN_NAME", "TYPE_NAME", "COLUMN_SIZE", "NULLABLE");
            print("primary keys", md.getPrimaryKeys(null, "public", "jt"), "COLUMN_NAME", "KEY_SEQ", "PK_NAME");

            try (PreparedStatement ins = c.prepareStatement("INSERT INTO jt VALUES (?, ?, ?, ?)")) {
                for (int i = 1; i <= 3; i++) {
                    ins.setLong(1, i);
                    ins.setString(2, i == 3 ? "b" : "a");
                    ins.setBigDecimal(3, new java.math.BigDecimal(i + ".50"));
                    ins.setTimestamp(4, Timestamp.valueOf("2026-01-0" + i + " 10:00:00"));
                    ins.executeUpdate();
                }
            }
            try (PreparedStatement q = c.prepareStatement("SELECT id, name, price, seen FROM jt WHERE id >= ? AND name = ? ORDER BY id")) {
                q.setLong(1, 2);
                q.setString(2, "a");
                try (ResultSet rs = q.executeQuery()) {
                    ResultSetMetaData m = rs.getMetaData();
                    StringJoiner j = new StringJoiner(",");
                    for (int i = 1; i <= m.getColumnCount(); i++) {
                        j.add(m.getColumnName(i) + ":" + m.getColumnTypeName(i));
                    }
                    System.out.println("result columns: " + j);
                    print("rows", rs, "id", "name", "price", "seen");
                }
            }
            // A view's rows, once the insert has reached it.
            try (Statement s = c.createStatement()) {
                s.execute("FLUSH");
                print("view", s.executeQuery("SELECT name, n FROM jv ORDER BY name"), "name", "n");
            }
            // An error keeps its SQLSTATE and leaves the connection usable.
            try (Statement s = c.createStatement()) {
                s.executeQuery("SELECT * FROM nowhere");
            } catch (SQLException e) {
                System.out.println("error: " + e.getSQLState());
            }
            try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SELECT 1 AS one")) {
                print("after error", rs, "one");
            }
        }
    }
}
