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

func TestRunConnectionKilled(t *testing.T) {
	e := sqltest.NewRunEnv(t, sqltest.PostgresPool(t, sqltest.TestConns), sqlstore.Postgres, testenv.PostgresDSN(t))
	kill := func(ctx context.Context, tx *sql.Tx) error {
		var pid int
		if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		_, err := e.DB.ExecContext(ctx, "SELECT pg_terminate_backend($1)", pid)
		return err
	}
	if _, _, err := e.St.Run(t.Context(), "k", nil, e.Write("k", "x", kill)); err == nil {
		t.Errorf("Run whose connection died = nil error; want one")
	}
	e.Fact("k", false)
	if res, replayed, err := e.St.Run(t.Context(), "k", nil, e.Write("k", "ok", nil)); err != nil || replayed || string(res) != "ok" {
		t.Errorf("Run after a dead connection = %q, replayed %v, %v; want the work done", res, replayed, err)
	}
	e.Fact("k", true)
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
	d := map[string]sqlstore.Dialect{"postgres": sqlstore.Postgres, "sqlite": sqlstore.SQLite}[os.Getenv("IDEM_RUN_HELPER")]
	if d == 0 {
		return
	}
	db, err := sql.Open(map[sqlstore.Dialect]string{sqlstore.Postgres: "pgx", sqlstore.SQLite: "sqlite"}[d], os.Getenv("IDEM_RUN_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	e := &sqltest.RunEnv{T: t, DB: db, Dialect: d, Table: os.Getenv("IDEM_RUN_TABLE"), Effects: os.Getenv("IDEM_RUN_EFFECTS")}
	st := e.Store(sqlstore.Options{})
	die := func(context.Context, *sql.Tx) error { os.Exit(3); return nil }
	_, _, err = st.Run(context.Background(), "k", nil, e.Write("k", "x", die))
	t.Fatalf("Run returned %v; the process should have died inside it", err)
}
