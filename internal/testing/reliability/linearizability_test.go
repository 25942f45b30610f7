package reliability_test

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/lincheck"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
	"github.com/redis/go-redis/v9"
)

// Linearizability: many clients call Claim, Confirm, Forget, Renew and
// Lookup (and ClaimBatch, ConfirmBatch) on a few keys at once, and
// porcupine checks every recorded history against a sequential store that
// keeps the Store contract (see internal/lincheck). A few calls get a
// deadline short enough to cut them off mid-call; their outcome is unknown,
// and the check accepts them as applied or not.

var (
	linHistories = flag.Int("idem.histories", 200, "linearizability: `number` of histories per backend")
	linSeed      = flag.Uint64("idem.seed", 0, "linearizability: `seed` of the first history (0: from the clock)")
	linOps       = flag.Int("idem.ops", 0, "linearizability: `calls` per client in a history (0: the backend's default)")
	linCutFlag   = flag.Float64("idem.cut", -1, "linearizability: `fraction` of calls cut off by a short deadline (-1: the backend's default)")
)

// linLease outlives every history by far (the model has no clock), and
// lets the records of a shared server expire soon after.
const linLease = time.Minute

// linSize is the shape of a backend's histories: clients (pairs of them
// share a worker) making ops calls each on 3 fresh keys, a share cut of the
// calls cut off by a deadline under 2ms. Sized so that 200 histories per
// backend cost well under a minute of CPU in all under -race: SQLite
// (modernc parses every statement, slowly under the race detector's
// pointer checks), Postgres and MySQL (a cut call costs a new connection)
// get smaller ones. -idem.ops and -idem.cut override them for longer runs.
type linSize struct {
	clients, ops int
	cut          float64
	bare         bool // lincheck.Workload.Bare: a consumer's calls
}

var (
	linFast     = linSize{clients: 5, ops: 20, cut: 0.03}
	linPostgres = linSize{clients: 5, ops: 12, cut: 0.01}
	linSQLite   = linSize{clients: 4, ops: 6, cut: 0.03}
)

const (
	linKeys = 3
	// linBatch of the claims and confirms go through ClaimBatch and
	// ConfirmBatch, each item checked as a call of its own.
	linBatch = 0.2
)

// checkLinearizable runs the histories on the stores open returns, one per
// worker name, and logs what it checked.
func checkLinearizable(t *testing.T, size linSize, open func(worker string) idem.Store) lincheck.Tally {
	// Braces, a colon and a NUL: keys are bytes, and the Redis hash tag
	// must not be fooled.
	return checkLinearizableOn(t, size, open, func(run int64, i, k int) string {
		return fmt.Sprintf("lin:%d:%d:{k%d}\x00", run, i, k)
	})
}

// checkLinearizableOn is checkLinearizable on the keys key names: key k
// of history i of the run, each fresh.
func checkLinearizableOn(t *testing.T, size linSize, open func(worker string) idem.Store, key func(run int64, i, k int) string) lincheck.Tally {
	if *linOps > 0 {
		size.ops = *linOps
	}
	if *linCutFlag >= 0 {
		size.cut = *linCutFlag
	}
	seed := *linSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	stores := map[string]idem.Store{}
	var clients []lincheck.Client
	for c := range size.clients {
		worker := fmt.Sprintf("lin-w%d", c/2)
		if stores[worker] == nil {
			stores[worker] = open(worker)
		}
		clients = append(clients, lincheck.Client{Store: stores[worker], Worker: worker})
	}
	run := time.Now().UnixNano() // keys of one run apart from an earlier run's on a shared server
	start := time.Now()
	tally := lincheck.Verify(t, *linHistories, seed, "idem.seed", func(i int) lincheck.Workload {
		w := lincheck.Workload{Clients: clients, Ops: size.ops, Cut: size.cut, Batch: linBatch, Bare: size.bare}
		for k := range linKeys {
			w.Keys = append(w.Keys, key(run, i, k))
		}
		return w
	})
	t.Logf("%s: %v in %v (%d clients × %d calls on %d keys; seed %d: -idem.seed=%d -idem.histories=%d repeats the calls)",
		t.Name(), tally, time.Since(start).Round(time.Millisecond), size.clients, size.ops, linKeys, seed, seed, tally.Histories)
	return tally
}

func linOptions(worker string) idem.Options {
	return idem.Options{Worker: worker, LeaseTTL: linLease, Retention: linLease}
}

func TestLinearizableMemoryStore(t *testing.T) {
	m := memStore(idem.Options{})
	checkLinearizable(t, linFast, func(worker string) idem.Store { return must(m.Share(linOptions(worker))) })
}

// linRedis opens RedisStores under one fresh prefix on c. c must respect
// context deadlines (ContextTimeoutEnabled): go-redis otherwise lets a call
// run past its deadline, and no outcome would be unknown.
func linRedis(t *testing.T, c redis.UniversalClient) func(worker string) idem.Store {
	return linRedisWith(t, c, idem.RedisOptions{})
}

// writeFormKey writes prefix's form key (RedisOptions.FieldHashes) for n
// hashes a slot as if a minute ago: the stores then write fields from the
// first confirm, without the grace a store that writes it waits.
func writeFormKey(t *testing.T, c redis.UniversalClient, prefix string, n int) {
	t.Helper()
	past := time.Now().Add(-time.Minute).UnixMilli()
	if err := c.Set(context.Background(), prefix+"fields", fmt.Sprintf("%d:%d", n, past), 0).Err(); err != nil {
		t.Fatalf("writing the form key: %v", err)
	}
}

// linRedisWith is linRedis with the Redis-only options of o.
func linRedisWith(t *testing.T, c redis.UniversalClient, o idem.RedisOptions) func(worker string) idem.Store {
	prefix := testenv.UniquePrefix()
	if o.FieldHashes > 0 {
		writeFormKey(t, c, prefix, o.FieldHashes)
	}
	return func(worker string) idem.Store {
		ro := idem.RedisOptionsFrom(linOptions(worker))
		ro.Prefix, ro.FieldHashes = prefix, o.FieldHashes
		s, err := idem.NewRedisStore(c, ro)
		if err != nil {
			t.Fatalf("NewRedisStore = %v", err)
		}
		return s
	}
}

// TestLinearizableRedisStore checks histories on each server of the matrix.
func TestLinearizableRedisStore(t *testing.T) {
	testenv.EachServer(t, func(t *testing.T, srv testenv.Server) {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(t), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		checkLinearizable(t, linFast, linRedis(t, c))
	})
}

// TestLinearizableRedisStoreCluster checks histories on each 3-master
// cluster of the matrix.
func TestLinearizableRedisStoreCluster(t *testing.T) {
	testenv.EachCluster(t, func(t *testing.T, cs testenv.ClusterServer) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cs.Addrs(t), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		checkLinearizable(t, linFast, linRedis(t, c))
	})
}

// TestLinearizableRedisStoreFieldHashes checks a consumer's histories (no
// fingerprints, no results) with confirmations kept as hash fields, on
// the servers that keep them so (Redis 8.0, Valkey 9.1) and on a cluster.
func TestLinearizableRedisStoreFieldHashes(t *testing.T) {
	bare := linFast
	bare.bare = true
	for _, srv := range testenv.Servers {
		if !srv.FieldExpiry() {
			continue // confirmations stay keys: TestLinearizableRedisStore
		}
		t.Run(srv.Name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr(t), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			checkLinearizable(t, bare, linRedisWith(t, c, idem.RedisOptions{FieldHashes: 2}))
		})
	}
	for _, cs := range testenv.Clusters {
		if !cs.FieldExpiry() {
			continue
		}
		t.Run("cluster "+cs.Name, func(t *testing.T) {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cs.Addrs(t), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			checkLinearizable(t, bare, linRedisWith(t, c, idem.RedisOptions{FieldHashes: 1}))
		})
	}
}

func TestLinearizableSQLStorePostgres(t *testing.T) {
	db := sqltest.PostgresPool(t, 2*linPostgres.clients)
	table := sqltest.UniqueTable()
	sqltest.NewStore(t, db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: table})
	checkLinearizable(t, linPostgres, func(worker string) idem.Store {
		so := sqlstore.OptionsFrom(linOptions(worker), sqlstore.Postgres)
		so.Table = table
		s, err := sqlstore.New(db, so)
		if err != nil {
			t.Fatalf("sqlstore.New = %v", err)
		}
		return s
	})
}

// On MySQL a cut call costs a new connection too (the driver closes the
// connection it cancels a statement on): Postgres's size.
func TestLinearizableSQLStoreMySQL(t *testing.T) {
	db := sqltest.MySQLPool(t, 2*linPostgres.clients)
	table := sqltest.UniqueTable()
	sqltest.NewStore(t, db, sqlstore.Options{Dialect: sqlstore.MySQL, Table: table})
	checkLinearizable(t, linPostgres, func(worker string) idem.Store {
		so := sqlstore.OptionsFrom(linOptions(worker), sqlstore.MySQL)
		so.Table = table
		s, err := sqlstore.New(db, so)
		if err != nil {
			t.Fatalf("sqlstore.New = %v", err)
		}
		return s
	})
}

func TestLinearizableSQLStoreSQLite(t *testing.T) {
	db, _ := sqltest.SQLite(t)
	table := sqltest.UniqueTable()
	sqltest.NewStore(t, db, sqlstore.Options{Dialect: sqlstore.SQLite, Table: table})
	checkLinearizable(t, linSQLite, func(worker string) idem.Store {
		so := sqlstore.OptionsFrom(linOptions(worker), sqlstore.SQLite)
		so.Table = table
		s, err := sqlstore.New(db, so)
		if err != nil {
			t.Fatalf("sqlstore.New = %v", err)
		}
		return s
	})
}

// memStore is idem.NewMemoryStore for tests, whose options are valid.
func memStore(o idem.Options) *idem.MemoryStore {
	return must(idem.NewMemoryStore(o))
}

// must returns v, or panics with err: for constructors given options a
// test knows are valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
