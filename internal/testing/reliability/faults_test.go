package reliability_test

import (
	"bytes"
	"context"
	"database/sql"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/faultproxy"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// Fault tests: the workload of faults_ledger_test.go on real Redis and
// real Postgres, through a proxy that delays, loses replies, resets
// connections and blackholes traffic, and on a Redis whose script cache is
// flushed or which is killed and restarted. Each prints its counts.

// isClaim and isConfirm pick the workload's requests out of the traffic:
// a Claim carries the fingerprint; a Confirm carries the result marker
// (and, on both stores, the fingerprint too).
func isClaim(req []byte) bool {
	return bytes.Contains(req, faultFingerprint) && !bytes.Contains(req, []byte(faultDoneMarker))
}

func isConfirm(req []byte) bool { return bytes.Contains(req, []byte(faultDoneMarker)) }

// A fault is a way to hurt the traffic for a whole run. Its chaos function
// runs beside the workers; its check, afterwards, asserts what that fault
// must have caused.
type fault struct {
	name   string
	lease  time.Duration
	spread time.Duration // how long messages keep arriving
	// patient gives each call 2 s instead of 400 ms (and each Redis read
	// 1.5 s instead of 300 ms): for a fault that must cause no error, so
	// that a loaded machine's stall is not taken for one.
	patient bool
	chaos   func(ctx context.Context, p *faultproxy.Proxy, n *faultCounts)
	check   func(t *testing.T, r report, st faultproxy.Stats, n *faultCounts)
}

// faultCounts are the one-shot faults that met their request.
type faultCounts struct {
	claimDrops, confirmDrops, claimResets, confirmResets atomic.Int64
}

// fire arms one one-shot fault and waits until it meets its request.
func fire(ctx context.Context, p *faultproxy.Proxy, arm func()) bool {
	arm()
	for p.Pending() > 0 {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(2 * time.Millisecond):
		}
	}
	return true
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

var faults = []fault{
	{
		name:    "latency",
		lease:   time.Second,
		spread:  time.Second,
		patient: true,
		chaos: func(ctx context.Context, p *faultproxy.Proxy, _ *faultCounts) {
			// Slow and fast in turns: a lease must not care.
			for i := 0; ; i++ {
				p.SetLatency(time.Duration(i%3) * 8 * time.Millisecond)
				if !sleepCtx(ctx, 150*time.Millisecond) {
					p.SetLatency(0)
					return
				}
			}
		},
		check: func(t *testing.T, r report, _ faultproxy.Stats, _ *faultCounts) {
			if r.errors() != 0 {
				t.Errorf("%d errors with mere latency; want none; the first: %q", r.errors(), r.firstErrs)
			}
		},
	},
	{
		name:   "dropped-replies",
		lease:  500 * time.Millisecond,
		spread: time.Second,
		chaos: func(ctx context.Context, p *faultproxy.Proxy, n *faultCounts) {
			for i := 0; i < 24; i++ {
				if !sleepCtx(ctx, 15*time.Millisecond) {
					return
				}
				if i%2 == 0 {
					if !fire(ctx, p, func() { p.DropNextReply(isClaim) }) {
						return
					}
					n.claimDrops.Add(1)
				} else {
					if !fire(ctx, p, func() { p.DropNextReply(isConfirm) }) {
						return
					}
					n.confirmDrops.Add(1)
				}
			}
		},
		check: func(t *testing.T, r report, st faultproxy.Stats, n *faultCounts) {
			claims, confirms := int(n.claimDrops.Load()), int(n.confirmDrops.Load())
			if claims == 0 || confirms == 0 {
				t.Fatalf("the proxy lost %d claim and %d confirm replies; want some of each", claims, confirms)
			}
			// Every lost reply reached its caller as an error: none was
			// taken for a success.
			if r.claimErrs < claims || r.confirmErrs < confirms {
				t.Errorf("claim errors %d for %d lost claim replies, confirm errors %d for %d lost confirm replies; "+
					"want an error for each", r.claimErrs, claims, r.confirmErrs, confirms)
			}
			if r.orphans == 0 {
				t.Errorf("no unknown-outcome claim was ever seen blocking its key; want the %d lost claim replies to leave some", claims)
			}
		},
	},
	{
		name:   "connection-resets",
		lease:  500 * time.Millisecond,
		spread: time.Second,
		chaos: func(ctx context.Context, p *faultproxy.Proxy, n *faultCounts) {
			// In turns: a Confirm reset before it reaches the server (it
			// never ran), a Claim and a Confirm reset after (they may
			// have run); now and then every connection at once.
			for i := 1; i <= 30; i++ {
				if !sleepCtx(ctx, 15*time.Millisecond) {
					return
				}
				if i%10 == 0 {
					p.ResetAll()
					continue
				}
				match, forward, count := isConfirm, false, &n.confirmResets
				switch i % 3 {
				case 1:
					match, forward, count = isClaim, true, &n.claimResets
				case 2:
					forward = true
				}
				if !fire(ctx, p, func() { p.ResetNext(match, forward) }) {
					return
				}
				count.Add(1)
			}
		},
		check: func(t *testing.T, r report, _ faultproxy.Stats, n *faultCounts) {
			claims, confirms := int(n.claimResets.Load()), int(n.confirmResets.Load())
			if claims == 0 || confirms == 0 {
				t.Fatalf("%d claims and %d confirms were reset mid-command; want some of each", claims, confirms)
			}
			if r.claimErrs < claims || r.confirmErrs < confirms {
				t.Errorf("claim errors %d for %d claims reset mid-command, confirm errors %d for %d confirms; want an error for each",
					r.claimErrs, claims, r.confirmErrs, confirms)
			}
		},
	},
	{
		name:   "blackholes",
		lease:  600 * time.Millisecond,
		spread: 2 * time.Second,
		chaos: func(ctx context.Context, p *faultproxy.Proxy, _ *faultCounts) {
			// A short blackhole, which calls outlast or time out, and one
			// longer than a lease, which leaves confirms to give up;
			// each followed by more than a lease of calm, so that no
			// lease spans two of them.
			for _, d := range []time.Duration{250 * time.Millisecond, 900 * time.Millisecond} {
				if !sleepCtx(ctx, 100*time.Millisecond) {
					return
				}
				p.Blackhole(d)
				if !sleepCtx(ctx, d+700*time.Millisecond) {
					return
				}
			}
		},
		check: func(t *testing.T, r report, st faultproxy.Stats, _ *faultCounts) {
			if st.Held == 0 || r.errors() == 0 {
				t.Errorf("%d chunks held, %d errors seen; want the blackholes to have held traffic and failed calls", st.Held, r.errors())
			}
		},
	},
}

// faultWorkload is the run every fault gets: small enough that all of
// them, on both stores, stay within seconds.
func faultWorkload(f fault) workload {
	w := workload{messages: 120, workers: 4, lease: f.lease, opTimeout: 400 * time.Millisecond,
		crashRate: 0.02, failRate: 0.05, spread: f.spread, limit: 30 * time.Second}
	if f.patient {
		w.opTimeout = 2 * time.Second
	}
	return w
}

// ioTimeout is a Redis client's dial, read and write timeout for f.
func (f fault) ioTimeout() time.Duration {
	if f.patient {
		return 1500 * time.Millisecond
	}
	return 300 * time.Millisecond
}

// TestFaultsRedis runs the workload through the fault proxy on each server
// of the matrix (Redis 7, Redis 8.0, Valkey 8.1, Valkey 9.1).
// go-redis's own retries are off (MaxRetries -1) so that each fault
// reaches the caller; with them on, a lost reply is retried and answered
// by the store as the same attempt (see TestRedisLostReply).
func TestFaultsRedis(t *testing.T) {
	t.Parallel()
	testenv.EachServer(t, func(t *testing.T, srv testenv.Server) {
		direct := srv.Client(t)
		for _, f := range faults {
			t.Run(f.name, func(t *testing.T) {
				p := startFaultProxy(t, direct.Options().Addr)
				prefix := testenv.UniquePrefix()
				t.Cleanup(func() {
					if err := testenv.DeletePrefix(context.Background(), direct, prefix); err != nil {
						t.Errorf("deleting the test's keys %s*: %v", prefix, err)
					}
				})
				ds, err := idem.NewRedisStore(direct, idem.RedisOptions{Prefix: prefix})
				if err != nil {
					t.Fatalf("NewRedisStore: %v", err)
				}
				open := func(i int, o idem.Options) idem.Store {
					io := f.ioTimeout()
					c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, PoolSize: 4,
						DialTimeout: io, ReadTimeout: io, WriteTimeout: io})
					t.Cleanup(func() { _ = c.Close() })
					ro := idem.RedisOptionsFrom(o)
					ro.Prefix = prefix
					s, err := idem.NewRedisStore(c, ro)
					if err != nil {
						t.Fatalf("NewRedisStore through the proxy: %v", err)
					}
					return s
				}
				runFault(t, f, p, open, ds)
			})
		}
	})
}

// TestFaultsPostgres runs the workload through the fault proxy on real
// Postgres, in lease mode.
func TestFaultsPostgres(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatalf("parsing %s: %v", testenv.PostgresDSNVar, err)
	}
	upstream := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	db := sqltest.Postgres(t)
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			p := startFaultProxy(t, upstream)
			table := sqltest.UniqueTable()
			ds := sqltest.NewStore(t, db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: table})
			pc := cfg.Copy()
			pc.Host, pc.Port = "127.0.0.1", portOf(t, p.Addr())
			pc.ConnectTimeout = time.Second
			pdb := stdlib.OpenDB(*pc)
			// Idle connections stay open: a connection closed for the
			// pool's sake would be traffic no caller waits for.
			pdb.SetMaxOpenConns(8)
			pdb.SetMaxIdleConns(8)
			t.Cleanup(func() { _ = pdb.Close() })
			open := func(i int, o idem.Options) idem.Store {
				so := sqlstore.OptionsFrom(o, sqlstore.Postgres)
				so.Table = table
				s, err := sqlstore.New(pdb, so)
				if err != nil {
					t.Fatalf("sqlstore.New through the proxy: %v", err)
				}
				return s
			}
			runFault(t, f, p, open, ds)
		})
	}
}

// TestFaultsMySQL runs the workload through the fault proxy on the real
// MySQL or MariaDB, in lease mode, as TestFaultsPostgres does on Postgres.
func TestFaultsMySQL(t *testing.T) {
	t.Parallel()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatalf("parsing %s: %v", testenv.MySQLDSNVar, err)
	}
	db := sqltest.MySQL(t)
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			p := startFaultProxy(t, cfg.Addr)
			table := sqltest.UniqueTable()
			ds := sqltest.NewStore(t, db, sqlstore.Options{Dialect: sqlstore.MySQL, Table: table})
			pc := cfg.Clone()
			pc.Net, pc.Addr, pc.Timeout = "tcp", p.Addr(), time.Second
			conn, err := mysql.NewConnector(pc)
			if err != nil {
				t.Fatal(err)
			}
			pdb := sql.OpenDB(conn)
			pdb.SetMaxOpenConns(8)
			pdb.SetMaxIdleConns(8)
			t.Cleanup(func() { _ = pdb.Close() })
			open := func(i int, o idem.Options) idem.Store {
				so := sqlstore.OptionsFrom(o, sqlstore.MySQL)
				so.Table = table
				s, err := sqlstore.New(pdb, so)
				if err != nil {
					t.Fatalf("sqlstore.New through the proxy: %v", err)
				}
				return s
			}
			runFault(t, f, p, open, ds)
		})
	}
}

func runFault(t *testing.T, f fault, p *faultproxy.Proxy, open func(int, idem.Options) idem.Store, direct idem.Store) {
	t.Helper()
	var n faultCounts
	r := runWorkload(t, faultWorkload(f), open, direct, func(ctx context.Context, _ *ledger) {
		f.chaos(ctx, p, &n)
	})
	st := p.Stats()
	t.Logf("%s: %v; proxy: %d replies lost (%d claim, %d confirm), %d connections reset (%d claims, %d confirms mid-command), %d chunks held",
		f.name, r, st.DroppedReplies, n.claimDrops.Load(), n.confirmDrops.Load(), st.Resets,
		n.claimResets.Load(), n.confirmResets.Load(), st.Held)
	f.check(t, r, st, &n)
}

func startFaultProxy(t *testing.T, upstream string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(upstream)
	if err != nil {
		t.Fatalf("faultproxy.Start(%q): %v", upstream, err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func portOf(t *testing.T, addr string) uint16 {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	n, err2 := strconv.ParseUint(port, 10, 16)
	if err != nil || err2 != nil {
		t.Fatalf("address %q has no port", addr)
	}
	return uint16(n)
}
