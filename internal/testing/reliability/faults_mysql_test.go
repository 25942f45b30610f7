package reliability_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// TestFaultsMySQLRestart kills a MariaDB of the test's own (SIGKILL) twice
// during the lease-mode workload and starts it again on the same port and
// data directory. InnoDB flushes each commit to its redo log before it
// answers (the server's default), so every Confirm that returned nil
// before a kill must still be there after the crash recovery; the store
// must recover by itself (new connections from the pool).
func TestFaultsMySQLRestart(t *testing.T) {
	t.Parallel()
	srv := testenv.StartMariaDBServer(t)
	direct, err := sql.Open("mysql", srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	table := sqltest.UniqueTable()
	ds := sqltest.NewStore(t, direct, sqlstore.Options{Dialect: sqlstore.MySQL, Table: table})
	cfg, err := mysql.ParseDSN(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = 300*time.Millisecond, time.Second, time.Second
	base, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dials := &countingConnector{Connector: base}
	db := sql.OpenDB(dials)
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	t.Cleanup(func() { _ = db.Close() })
	open := func(i int, o idem.Options) idem.Store {
		so := sqlstore.OptionsFrom(o, sqlstore.MySQL)
		so.Table = table
		s, err := sqlstore.New(db, so)
		if err != nil {
			t.Fatalf("sqlstore.New: %v", err)
		}
		return s
	}
	var restarts, checked, survived, dialsAfter atomic.Int64
	w := workload{messages: 150, workers: 4, lease: 500 * time.Millisecond, opTimeout: 400 * time.Millisecond,
		crashRate: 0.02, failRate: 0.05, spread: 3 * time.Second, limit: 60 * time.Second}
	r := runWorkload(t, w, open, ds, func(ctx context.Context, led *ledger) {
		for range 2 {
			if !sleepCtx(ctx, 500*time.Millisecond) {
				return
			}
			killed := time.Now()
			srv.Kill()
			confirmed := led.confirmedBefore(killed)
			before := dials.n.Load()
			time.Sleep(150 * time.Millisecond)
			if !srv.Start() {
				return
			}
			restarts.Add(1)
			for _, k := range confirmed {
				checked.Add(1)
				// Not ctx: the check must finish even if the workload has.
				lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				rec, err := ds.Lookup(lctx, k)
				cancel()
				if err != nil || !rec.Confirmed {
					t.Errorf("message %q was confirmed before the kill; after the restart Lookup = %+v, %v", k, rec, err)
					continue
				}
				survived.Add(1)
			}
			if !sleepCtx(ctx, 300*time.Millisecond) {
				return
			}
			dialsAfter.Add(dials.n.Load() - before)
		}
	})
	t.Logf("restart: %v; restarts %d, confirmed records checked after restarts %d, survived %d, connections opened after the kills %d",
		r, restarts.Load(), checked.Load(), survived.Load(), dialsAfter.Load())
	// New connections prove the workload reached the restarted server.
	if restarts.Load() != 2 || checked.Load() == 0 || dialsAfter.Load() == 0 {
		t.Errorf("restarts %d, records checked %d, connections after the kills %d; want 2 restarts that the workload reached",
			restarts.Load(), checked.Load(), dialsAfter.Load())
	}
}

// countingConnector counts the connections the pool opens.
type countingConnector struct {
	driver.Connector
	n atomic.Int64
}

func (c *countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err == nil {
		c.n.Add(1)
	}
	return conn, err
}
