package main

import (
	"flag"
	"fmt"

	"github.com/idemgo/idem/sqlstore"
)

const schemaAbout = `Prints the statements that create a SQL store's table and its index on
expires_at (sqlstore.SchemaDDL), each ending with a semicolon, for a migration
tool. They are idempotent (IF NOT EXISTS). With --upgrade, the statements that
bring a table made by an earlier release up to date instead (sqlstore.UpgradeDDL:
the columns of take-over reporting; on SQLite a rebuild of the table, to run in
one transaction). Connects to nothing.`

func (c *cli) schema(args []string) int {
	fs := flag.NewFlagSet("schema", flag.ContinueOnError)
	dialect := fs.String("dialect", "postgres", "the SQL `dialect`: postgres, mysql (MariaDB too) or sqlite")
	mysql := fs.Bool("mysql", false, "the MySQL and MariaDB table: --dialect mysql")
	table := fs.String("table", or(c.getenv(envTable), sqlstore.DefaultTable), "the `table` name, optionally schema-qualified (env "+envTable+")")
	upgrade := fs.Bool("upgrade", false, "print the statements that upgrade an earlier release's table instead")
	pos, done, st := c.parse(fs, args, "[--dialect postgres|mysql|sqlite | --mysql] [--table NAME] [--upgrade]", schemaAbout)
	if done {
		return st
	}
	if len(pos) > 0 {
		return c.noArgs("schema", pos)
	}
	if *mysql {
		if givenFlags(fs)["dialect"] && *dialect != "mysql" && *dialect != "mariadb" {
			return c.usageError("schema", fmt.Errorf("--mysql with --dialect %s: give one", *dialect))
		}
		*dialect = "mysql"
	}
	d, err := parseDialect(*dialect)
	if err != nil {
		return c.usageError("schema", err)
	}
	ddlOf := sqlstore.SchemaDDL
	if *upgrade {
		ddlOf = sqlstore.UpgradeDDL
	}
	ddl, err := ddlOf(d, *table)
	if err != nil {
		return c.usageError("schema", err)
	}
	if len(ddl) == 0 {
		// MySQL's table has had every column since the dialect came.
		fmt.Fprintf(c.stdout, "-- nothing to upgrade: a %s table made by any release has every column\n", d)
	}
	for i, q := range ddl {
		if i > 0 {
			fmt.Fprintln(c.stdout)
		}
		fmt.Fprintf(c.stdout, "%s;\n", q)
	}
	return exitOK
}

func parseDialect(s string) (sqlstore.Dialect, error) {
	switch s {
	case "postgres", "postgresql":
		return sqlstore.Postgres, nil
	case "sqlite", "sqlite3":
		return sqlstore.SQLite, nil
	case "mysql", "mariadb":
		return sqlstore.MySQL, nil
	}
	return 0, fmt.Errorf("unknown --dialect %q: want postgres, mysql or sqlite", s)
}
