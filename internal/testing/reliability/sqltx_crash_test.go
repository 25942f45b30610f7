package reliability_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// Run's work dies half done: the connection, or the whole process. The
// transaction never commits, so neither the effect nor the record is left,
// and the next Run does the work.

// TestRunConnectionKilled kills Run's connection from another one (the
// server ends it) at each point of the transaction: right after the claim,
// in the middle of the write (after the effect), and after the write
// returned but before the record and the commit (Run's own statements then
// meet a dead connection). Neither the effect nor the record may be left,
// and the next Run does the work.
func TestRunConnectionKilled(t *testing.T) {
	servers(t, func(t *testing.T, e *sqltest.RunEnv) {
		ctx := t.Context()
		// connID and kill say which server connection a transaction is on,
		// and end it from another.
		connID, kill := "SELECT pg_backend_pid()", "SELECT pg_terminate_backend($1)"
		if e.Dialect == sqlstore.MySQL {
			connID, kill = "SELECT CONNECTION_ID()", "KILL CONNECTION ?"
		}
		killOwn := func(ctx context.Context, tx *sql.Tx) error {
			var id int64
			if err := tx.QueryRowContext(ctx, connID).Scan(&id); err != nil {
				return err
			}
			_, err := e.DB.ExecContext(ctx, kill, id)
			return err
		}
		for _, at := range []string{"before-effect", "after-effect", "after-write"} {
			key := "k-" + at
			var write func(context.Context, *sql.Tx) ([]byte, error)
			switch at {
			case "before-effect":
				inner := e.Write(key, "x", nil)
				write = func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
					if err := killOwn(ctx, tx); err != nil {
						return nil, err
					}
					return inner(ctx, tx)
				}
			case "after-effect":
				write = e.Write(key, "x", killOwn)
			case "after-write":
				// The write succeeds; its connection is gone when Run
				// records and commits.
				write = e.Write(key, "x", func(ctx context.Context, tx *sql.Tx) error {
					_ = killOwn(ctx, tx)
					return nil
				})
			}
			if _, _, err := e.St.Run(ctx, key, nil, write); err == nil {
				t.Errorf("%s: Run whose connection died = nil error; want one", at)
			}
			e.Fact(key, false)
			if res, replayed, err := e.St.Run(ctx, key, nil, e.Write(key, "ok", nil)); err != nil || replayed || string(res) != "ok" {
				t.Errorf("%s: Run after a dead connection = %q, replayed %v, %v; want the work done", at, res, replayed, err)
			}
			e.Fact(key, true)
		}
	})
}

// servers runs f on each database server, Postgres and MySQL, on a RunEnv
// of its own.
func servers(t *testing.T, f func(t *testing.T, e *sqltest.RunEnv)) {
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, sqltest.NewRunEnv(t, sqltest.PostgresPool(t, sqltest.TestConns), sqlstore.Postgres, testenv.PostgresDSN(t)))
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		f(t, sqltest.NewRunEnv(t, sqltest.MySQLPool(t, sqltest.TestConns), sqlstore.MySQL, testenv.MySQLDSN(t)))
	})
}

// TestRunProcessDies runs a Run in another process that exits in the middle
// of the write: the next Run must do the work.
func TestRunProcessDies(t *testing.T) {
	sqltest.EachDialect(t, func(e *sqltest.RunEnv) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRunHelperProcess$")
		cmd.Env = append(os.Environ(), "IDEM_RUN_HELPER="+e.Dialect.String(), "IDEM_RUN_DSN="+e.DSN,
			"IDEM_RUN_TABLE="+e.Table, "IDEM_RUN_EFFECTS="+e.Effects)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 3 {
			t.Fatalf("helper process = %v (%s); want it to die with status 3 inside the write", err, out)
		}
		e.Fact("k", false)
		if res, replayed, err := e.St.Run(t.Context(), "k", nil, e.Write("k", "ok", nil)); err != nil || replayed || string(res) != "ok" {
			t.Errorf("Run after the process died = %q, replayed %v, %v; want the work done", res, replayed, err)
		}
		e.Fact("k", true)
	})
}

// TestRunHelperProcess is TestRunProcessDies's other process; it does
// nothing in a normal test run.
func TestRunHelperProcess(t *testing.T) {
	d := map[string]sqlstore.Dialect{"postgres": sqlstore.Postgres, "sqlite": sqlstore.SQLite, "mysql": sqlstore.MySQL}[os.Getenv("IDEM_RUN_HELPER")]
	if d == 0 {
		return
	}
	db, err := sql.Open(map[sqlstore.Dialect]string{sqlstore.Postgres: "pgx", sqlstore.SQLite: "sqlite", sqlstore.MySQL: "mysql"}[d], os.Getenv("IDEM_RUN_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	e := &sqltest.RunEnv{T: t, DB: db, Dialect: d, Table: os.Getenv("IDEM_RUN_TABLE"), Effects: os.Getenv("IDEM_RUN_EFFECTS")}
	st := e.Store(sqlstore.Options{})
	die := func(context.Context, *sql.Tx) error { os.Exit(3); return nil }
	_, _, err = st.Run(context.Background(), "k", nil, e.Write("k", "x", die))
	t.Fatalf("Run returned %v; the process should have died inside it", err)
}
