package main

// The database/sql drivers are compiled in by driver_postgres.go,
// driver_mysql.go and driver_sqlite.go, each behind a build tag that leaves
// it out: together
// they are about a third of a cold build of the command, and the demo's
// default store (the embedded Redis) needs neither. A command given a store
// whose driver was left out says which tag did it.

// Build tags that leave a SQL driver out of the command.
const (
	tagNoPostgres = "idem_nopostgres"
	tagNoSQLite   = "idem_nosqlite"
	tagNoMySQL    = "idem_nomysql"
)

// postgresDriver, mysqlDriver and sqliteDriver are the database/sql driver
// names of the drivers compiled in; "" when a build tag left the driver out.
var postgresDriver, mysqlDriver, sqliteDriver string
