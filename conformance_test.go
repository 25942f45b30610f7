package idem_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
	"github.com/idemgo/idem/storetest"
)

// waiting is how many of the package's parallel tests run at once unless
// -parallel says otherwise. Most of them wait on a clock, not a CPU: the
// conformance suite's checks let leases and retention run out in real time
// on real servers (seconds each, a few milliseconds of CPU), so the
// default (GOMAXPROCS) would leave the machine idle for minutes while
// each check's wait queued behind the last. Bounded all the same: every
// check holds a few connections to the shared servers. Not under the race
// detector: its calls cost several times the CPU, and 16 checks at once
// on 2 cores then stretch calls past the suite's one-second leases (two
// racing claims both Claimed, as the first one's lease ran out).
const waiting = 16

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given && !testenv.RaceEnabled {
		if err := flag.Set("test.parallel", strconv.Itoa(max(waiting, runtime.GOMAXPROCS(0)))); err != nil {
			panic(err)
		}
	}
	// The field form's stores write fields at once: the suite's checks
	// run in seconds (TestRedisFieldForm checks the grace).
	idem.SetFormGrace(0)
	os.Exit(m.Run())
}

func TestMemoryStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(*testing.T) storetest.Backend { return storetest.MemoryBackend() })
}

func TestRedisStoreConformanceMiniredis(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		return miniredisBackend(t, idem.RedisOptions{Prefix: "idem:"})
	})
}

// The suite again without automatic pipelining (on by default): every
// check must hold whether a call goes alone or in a pipeline with others.

func TestRedisStoreConformanceMiniredisNoAutoPipeline(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		return miniredisBackend(t, idem.RedisOptions{Prefix: "idem:", NoAutoPipeline: true})
	})
}

func TestRedisStoreConformanceNoAutoPipeline(t *testing.T) {
	t.Parallel()
	testenv.EachServer(t, func(t *testing.T, srv testenv.Server) {
		t.Parallel()
		c := srv.Client(t)
		storetest.Run(t, func(t *testing.T) storetest.Backend {
			return redisBackend(c, idem.RedisOptions{Prefix: testenv.UniquePrefix(), NoAutoPipeline: true}, nil)
		})
	})
}

func TestRedisStoreConformanceClusterNoAutoPipeline(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t)
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		return redisBackend(c, idem.RedisOptions{Prefix: testenv.UniquePrefix(), NoAutoPipeline: true}, nil)
	})
}

// The suite on each server of the matrix (Redis 7, Redis 8.0, Valkey 8.1,
// Valkey 9.1), a subtest per server: what a user runs idem on must keep
// the contract.
func TestRedisStoreConformance(t *testing.T) {
	t.Parallel()
	testenv.EachServer(t, func(t *testing.T, srv testenv.Server) {
		t.Parallel()
		c := srv.Client(t)
		storetest.Run(t, func(t *testing.T) storetest.Backend {
			return redisBackend(c, idem.RedisOptions{Prefix: testenv.UniquePrefix()}, nil)
		})
	})
}

// The suite with confirmations kept as hash fields (FieldHashes), on each
// server of the matrix: Redis 8.0 and Valkey 9.1 keep them as fields, Redis
// 7 and Valkey 8.1 (no HSETEX) as keys, and miniredis neither has.
func TestRedisStoreConformanceFieldHashes(t *testing.T) {
	t.Parallel()
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, func(t *testing.T) storetest.Backend {
			return miniredisBackend(t, idem.RedisOptions{Prefix: "idem:", FieldHashes: 2})
		})
	})
	testenv.EachServer(t, func(t *testing.T, srv testenv.Server) {
		t.Parallel()
		c := srv.Client(t)
		storetest.Run(t, func(t *testing.T) storetest.Backend {
			return redisBackend(c, idem.RedisOptions{Prefix: testenv.UniquePrefix(), FieldHashes: 2}, nil)
		})
	})
	testenv.EachCluster(t, func(t *testing.T, cs testenv.ClusterServer) {
		t.Parallel()
		c := cs.Client(t)
		storetest.Run(t, func(t *testing.T) storetest.Backend {
			return redisBackend(c, idem.RedisOptions{Prefix: testenv.UniquePrefix(), FieldHashes: 1}, nil)
		})
	})
}

// The suite on each 3-master cluster of the matrix (Redis 7, Valkey 9.1).
func TestRedisStoreConformanceCluster(t *testing.T) {
	t.Parallel()
	testenv.EachCluster(t, func(t *testing.T, cs testenv.ClusterServer) {
		t.Parallel()
		c := cs.Client(t)
		storetest.Run(t, func(t *testing.T) storetest.Backend {
			return redisBackend(c, idem.RedisOptions{Prefix: testenv.UniquePrefix()}, nil)
		})
	})
}

// miniredisBackend is redisBackend on a miniredis of the check's own,
// whose client can lose a reply (LoseReply) after the command ran.
func miniredisBackend(t *testing.T, ro idem.RedisOptions) storetest.Backend {
	m := miniredis.RunT(t)
	d := &testenv.LossyDialer{}
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), Dialer: d.Dial})
	t.Cleanup(func() { _ = c.Close() })
	b := redisBackend(c, ro, m.FastForward)
	b.LoseReply = func(key string, advance time.Duration) {
		d.OnLoss = func() { m.FastForward(advance) }
		// The claim's first reply: its token, one bulk string.
		d.Arm(key, 2)
	}
	return b
}

// redisBackend opens RedisStores with ro's prefix and Redis options on c.
// Every record the suite writes expires within seconds (a minute for the
// linearizability check's), so nothing needs deleting.
func redisBackend(c redis.UniversalClient, ro idem.RedisOptions, advance func(time.Duration)) storetest.Backend {
	return storetest.Backend{
		Open: func(o idem.Options) (idem.Store, error) {
			so := idem.RedisOptionsFrom(o)
			so.Prefix, so.NoAutoPipeline, so.WaitReplicas, so.WaitTimeout = ro.Prefix, ro.NoAutoPipeline, ro.WaitReplicas, ro.WaitTimeout
			return idem.NewRedisStore(c, so)
		},
		Advance: advance,
		// What forget.lua leaves: "1F<token>", for a lease.
		PlantForgotten: func(key string, token int64) error {
			return c.Set(context.Background(), redisKeyName(c, ro.Prefix, key), "1F"+strconv.FormatInt(token, 10), time.Minute).Err()
		},
	}
}

// redisKeyName is the Redis key of key's record under prefix on c, as a
// RedisStore names it (constructing one sends nothing).
func redisKeyName(c redis.UniversalClient, prefix, key string) string {
	s, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	return s.RecordKey(key)
}

func TestRedisStoreConformanceSentinel(t *testing.T) {
	t.Parallel()
	c := testenv.Sentinel(t)
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		return redisBackend(c, idem.RedisOptions{Prefix: testenv.UniquePrefix()}, nil)
	})
}

// sqlBackends opens each SQL backend with its connections counted
// (sqltest.CountingDB), and says its dialect.
func sqlBackends(t *testing.T) map[string]func(t *testing.T) (*sql.DB, *atomic.Int64, sqlstore.Dialect) {
	return map[string]func(t *testing.T) (*sql.DB, *atomic.Int64, sqlstore.Dialect){
		"sqlite": func(t *testing.T) (*sql.DB, *atomic.Int64, sqlstore.Dialect) {
			path := filepath.Join(t.TempDir(), "idem.db")
			db, c := sqltest.CountingDB(t, "sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
			return db, c, sqlstore.SQLite
		},
		"postgres": func(t *testing.T) (*sql.DB, *atomic.Int64, sqlstore.Dialect) {
			db, c := sqltest.CountingDB(t, "pgx", testenv.PostgresDSN(t))
			return db, c, sqlstore.Postgres
		},
		"mysql": func(t *testing.T) (*sql.DB, *atomic.Int64, sqlstore.Dialect) {
			db, c := sqltest.CountingDB(t, "mysql", testenv.MySQLDSN(t))
			return db, c, sqlstore.MySQL
		},
	}
}

// maxResult is the MaxResultBytes of the stores under test.
const maxResult = 64

// checkRefusedBeforeIO sends every kind of oversized or empty input to s
// and checks that each is refused with its sentinel and a message that
// says what is wrong, while io (the store's I/O so far) does not move.
func checkRefusedBeforeIO(t *testing.T, s idem.Store, io func() int64) {
	t.Helper()
	ctx := context.Background()
	long := strings.Repeat("k", idem.DefaultMaxKeyBytes+1)
	bigFP := make([]byte, idem.MaxFingerprintBytes+1)
	bigResult := make([]byte, maxResult+1)
	good := claimLease(t, s)
	longLease, emptyLease := *good, *good
	longLease.Key, emptyLease.Key = long, ""
	type call struct {
		name string
		do   func() error
		want error
		says string
	}
	calls := []call{
		{"Claim(empty key)", func() error { _, err := s.Claim(ctx, "", nil); return err }, idem.ErrInvalidKey, "empty key"},
		{"Claim(1025-byte key)", func() error { _, err := s.Claim(ctx, long, nil); return err }, idem.ErrInvalidKey, "exceeds MaxKeyBytes"},
		{"Claim(1025-byte fingerprint)", func() error { _, err := s.Claim(ctx, "sec-ok", bigFP); return err }, idem.ErrTooLarge, "fingerprint of 1025 bytes exceeds"},
		{"Lookup(1025-byte key)", func() error { _, err := s.Lookup(ctx, long); return err }, idem.ErrInvalidKey, "exceeds MaxKeyBytes"},
		{"Lookup(empty key)", func() error { _, err := s.Lookup(ctx, ""); return err }, idem.ErrInvalidKey, "empty key"},
		{"Renew(1025-byte key)", func() error { return s.Renew(ctx, &longLease) }, idem.ErrInvalidKey, "exceeds MaxKeyBytes"},
		{"Forget(empty key)", func() error { return s.Forget(ctx, &emptyLease) }, idem.ErrInvalidKey, "empty key"},
		{"Confirm(1025-byte key)", func() error { return s.Confirm(ctx, &longLease, nil) }, idem.ErrInvalidKey, "exceeds MaxKeyBytes"},
		{"Confirm(oversized result)", func() error { return s.Confirm(ctx, good, bigResult) }, idem.ErrTooLarge, "exceeds MaxResultBytes"},
		{"Confirm(nil lease)", func() error { return s.Confirm(ctx, nil, nil) }, idem.ErrInvalidLease, "nil *Lease"},
	}
	if b, ok := s.(idem.Batcher); ok {
		calls = append(calls,
			call{"ClaimBatch(one long key among good ones)", func() error {
				_, err := b.ClaimBatch(ctx, []string{"sec-a", long, "sec-b"}, nil)
				return err
			}, idem.ErrInvalidKey, "batch item 1"},
			call{"ClaimBatch(one oversized fingerprint)", func() error {
				_, err := b.ClaimBatch(ctx, []string{"sec-a", "sec-b"}, [][]byte{nil, bigFP})
				return err
			}, idem.ErrTooLarge, "batch item 1"},
			call{"ClaimBatch(fingerprints not matching keys)", func() error {
				_, err := b.ClaimBatch(ctx, []string{"sec-a", "sec-b"}, [][]byte{nil})
				return err
			}, idem.ErrInvalidKey, "2 keys and 1 fingerprints"},
			call{"ConfirmBatch(results not matching leases)", func() error {
				return b.ConfirmBatch(ctx, []*idem.Lease{good, good}, [][]byte{nil})
			}, idem.ErrInvalidLease, "2 leases and 1 results"},
			call{"ConfirmBatch(one oversized result)", func() error {
				return b.ConfirmBatch(ctx, []*idem.Lease{good, good}, [][]byte{nil, bigResult})
			}, idem.ErrTooLarge, "batch item 1"},
		)
	}
	if sq, ok := s.(*sqlstore.Store); ok {
		write := func(context.Context, *sql.Tx) ([]byte, error) {
			t.Errorf("Run called write for a refused input")
			return nil, nil
		}
		calls = append(calls,
			call{"Run(1025-byte key)", func() error { _, _, err := sq.Run(ctx, long, nil, write); return err }, idem.ErrInvalidKey, "exceeds MaxKeyBytes"},
			call{"Run(1025-byte fingerprint)", func() error { _, _, err := sq.Run(ctx, "sec-ok", bigFP, write); return err }, idem.ErrTooLarge, "exceeds"},
		)
	}
	before := io()
	for _, c := range calls {
		err := c.do()
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s = %v; want an error matching %v that says %q", c.name, err, c.want, c.says)
		}
		if n := io(); n != before {
			t.Errorf("%s did I/O (%d operations) before refusing its input; want none", c.name, n-before)
			before = n
		}
	}
}

// Oversized and empty inputs are refused with a clear error before any I/O,
// on every store: the Redis client sends and dials nothing, the database
// opens no connection.
func TestSecurityOversizedInputsBeforeIO(t *testing.T) {
	o := idem.Options{MaxResultBytes: maxResult}
	t.Run("memory", func(t *testing.T) {
		s := memStore(o)
		checkRefusedBeforeIO(t, s, func() int64 { return 0 })
		// Refused is not truncated: the 1024-byte prefix of the long key
		// was not claimed in its place.
		if _, err := s.Lookup(context.Background(), strings.Repeat("k", idem.DefaultMaxKeyBytes)); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Lookup of the long key's first 1024 bytes = %v; want ErrNotFound", err)
		}
	})
	t.Run("redis", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: testenv.Lookup(t, testenv.RedisAddrVar)})
		t.Cleanup(func() { _ = c.Close() })
		io := &testenv.IOCounter{}
		c.AddHook(io)
		ro := idem.RedisOptionsFrom(o)
		ro.Prefix = testenv.UniquePrefix()
		s, err := idem.NewRedisStore(c, ro)
		if err != nil {
			t.Fatalf("NewRedisStore = %v", err)
		}
		if n := io.N.Load(); n != 0 {
			t.Fatalf("NewRedisStore sent %d commands; want none (the server is checked on first contact)", n)
		}
		if _, err := s.Lookup(context.Background(), "sec-probe"); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("Lookup = %v; want ErrNotFound", err)
		}
		if io.N.Load() == 0 {
			t.Fatalf("the hook saw nothing of the first contact and a Lookup; want it to count what the client sends")
		}
		checkRefusedBeforeIO(t, s, io.N.Load)
	})
	for name, open := range sqlBackends(t) {
		t.Run(name, func(t *testing.T) {
			db, conns, d := open(t)
			table := sqltest.UniqueTable()
			ddl, err := sqlstore.SchemaDDL(d, table)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range ddl {
				if _, err := db.Exec(q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			t.Cleanup(func() { _, _ = db.Exec(sqltest.Query(d, `DROP TABLE "`+table+`"`)) })
			so := sqlstore.OptionsFrom(o, d)
			so.Table = table
			s, err := sqlstore.New(db, so)
			if err != nil {
				t.Fatalf("sqlstore.New = %v", err)
			}
			if _, err := s.Lookup(context.Background(), "sec-probe"); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("Lookup = %v; want ErrNotFound", err)
			}
			if conns.Load() == 0 {
				t.Fatalf("no connection counted for the schema and a Lookup; want the connector to count them")
			}
			checkRefusedBeforeIO(t, s, conns.Load)
		})
	}
}

// A store that cannot reach its server answers every operation with an
// error, never with an outcome: not Claimed (the work would run unguarded),
// not ErrNotFound (a caller would take the key for new).
func TestSecurityStoreDownIsError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Each store comes with a lease of its home, granted by a live store
	// of the same kind and prefix or table: the dead store must fail on
	// the way to its server, not refuse the lease.
	stores := map[string]func(t *testing.T) (idem.Store, *idem.Lease){
		"redis": func(t *testing.T) (idem.Store, *idem.Lease) {
			s, err := idem.NewRedisStore(testenv.DeadRedis(t), idem.RedisOptions{AllowEviction: true})
			if err != nil {
				t.Fatalf("NewRedisStore(AllowEviction) = %v; want a store, no I/O yet", err)
			}
			c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
			live, err := idem.NewRedisStore(c, idem.RedisOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return s, claimLease(t, live)
		},
	}
	for name, open := range sqlBackends(t) {
		stores[name] = func(t *testing.T) (idem.Store, *idem.Lease) {
			db, _, d := open(t)
			table := sqltest.UniqueTable()
			s, err := sqlstore.New(db, sqlstore.Options{Dialect: d, Table: table})
			if err != nil {
				t.Fatalf("sqlstore.New = %v", err)
			}
			_ = db.Close() // the database is gone from here on
			ldb, _ := sqltest.SQLite(t)
			live, err := sqlstore.New(ldb, sqlstore.Options{Dialect: sqlstore.SQLite, Table: table})
			if err != nil {
				t.Fatal(err)
			}
			if err := live.CreateSchema(context.Background()); err != nil {
				t.Fatal(err)
			}
			return s, claimLease(t, live)
		}
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			s, l := open(t)
			cl, err := s.Claim(ctx, "k", nil)
			if err == nil || cl.Outcome != 0 || cl.Lease != nil {
				t.Errorf("Claim = %v, %v; want an error and no outcome", cl.Outcome, err)
			}
			if _, err := s.Lookup(ctx, "k"); err == nil || errors.Is(err, idem.ErrNotFound) {
				t.Errorf("Lookup = %v; want an error other than ErrNotFound", err)
			}
			if err := s.Confirm(ctx, l, nil); err == nil {
				t.Errorf("Confirm = nil; want an error")
			}
			if err := s.Renew(ctx, l); err == nil || errors.Is(err, idem.ErrLeaseLost) {
				t.Errorf("Renew = %v; want an error other than ErrLeaseLost (KeepAlive retries those)", err)
			}
		})
	}
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

// claimLease claims a key of its own on s and returns the lease.
func claimLease(t *testing.T, s idem.Store) *idem.Lease {
	t.Helper()
	c, err := s.Claim(context.Background(), "lease-"+uuid.NewString(), nil)
	if err != nil || c.Outcome != idem.Claimed {
		t.Fatalf("Claim = %v, %v; want claimed", c.Outcome, err)
	}
	return c.Lease
}

// The least a RedisStore's ACL user needs, as the README prints it: its key
// prefix, and the commands the store sends. The scripts' own commands
// (SET, GET, DEL, PTTL, PEXPIRE, TIME) are checked against the user too.
const (
	aclKeys = "~idem:*"
	// aclStore are the commands of every store: its scripts and their
	// commands, and the first contact's checks (CONFIG GET, else INFO).
	aclStore = "+evalsha +script|load +set +get +del +pttl +pexpire +time +config|get +info"
	// aclConnect is what go-redis sends on each new connection beside
	// HELLO and AUTH, which need no permission. Refused, it would only be
	// a line in ACL LOG, but one per connection. CLIENT SETINFO exists
	// from Redis 7.2 (and in Valkey): Redis 7.0 does not know it (ACL
	// SETUSER refuses its name), and answers it as unknown.
	aclConnect = "+client|setinfo"
	// aclWait is for RedisOptions.WaitReplicas; aclCluster for Redis
	// Cluster: CLUSTER INFO is the probe's, CLUSTER SLOTS and COMMAND
	// go-redis's ClusterClient's (the slot map, and each command's keys
	// and routing).
	aclWait    = "+wait"
	aclCluster = "+cluster|info +cluster|slots +cluster|nodes +command"
	// aclOps is for an operator's listing of quarantined keys
	// (RedisStore.Quarantined, idem inspect --quarantined).
	aclOps = "+scan +getrange"
)

// aclLine returns the ACL SETUSER rules of a store's user under prefix
// (which must end in "idem:" for aclKeys' pattern, or be it), with the
// optional command groups asked for, less the rules in drop.
func aclLine(keys string, groups []string, drop ...string) []string {
	rules := []string{"on", ">secret", "resetkeys", keys, "resetchannels", "-@all"}
	for _, g := range groups {
		for _, r := range strings.Fields(g) {
			if !slices.Contains(drop, r) {
				rules = append(rules, r)
			}
		}
	}
	return rules
}

// setUser creates (or replaces) user on every node c reaches with rules.
func setUser(t *testing.T, c redis.UniversalClient, user string, rules []string) {
	t.Helper()
	ctx := context.Background()
	args := []any{"acl", "setuser", user, "reset"}
	for _, r := range rules {
		args = append(args, r)
	}
	set := func(ctx context.Context, c *redis.Client) error { return c.Do(ctx, args...).Err() }
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachShard(ctx, set)
		t.Cleanup(func() {
			_ = cc.ForEachShard(context.Background(), func(ctx context.Context, c *redis.Client) error {
				return c.Do(ctx, "acl", "deluser", user).Err()
			})
		})
	} else {
		err = set(ctx, c.(*redis.Client))
	}
	if err != nil {
		t.Fatalf("ACL SETUSER %s %s = %v", user, strings.Join(rules, " "), err)
	}
}

// aclDenials returns what ACL LOG holds about user on every node c
// reaches: each entry's object (the command or key refused) and reason.
func aclDenials(t *testing.T, c redis.UniversalClient, user string) []string {
	t.Helper()
	var out []string
	var mu sync.Mutex // ForEachShard reads the nodes at once
	read := func(ctx context.Context, c *redis.Client) error {
		v, err := c.Do(ctx, "acl", "log").Slice()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, e := range v {
			m := map[string]any{}
			switch e := e.(type) {
			case []any:
				for i := 0; i+1 < len(e); i += 2 {
					k, _ := e[i].(string)
					m[k] = e[i+1]
				}
			case map[any]any:
				for k, v := range e {
					ks, _ := k.(string)
					m[ks] = v
				}
			}
			if m["username"] == user {
				out = append(out, m["reason"].(string)+" "+m["object"].(string))
			}
		}
		return nil
	}
	ctx := context.Background()
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachShard(ctx, read)
	} else {
		err = read(ctx, c.(*redis.Client))
	}
	if err != nil {
		t.Fatalf("ACL LOG = %v", err)
	}
	return out
}

// connectRules are the connection's rules for srv: CLIENT SETINFO where
// the server knows it.
func connectRules(srv testenv.Server) string {
	if srv.Name == "redis7" {
		return "" // Debian's 7.0
	}
	return aclConnect
}

// The conformance suite over TLS (a CA and server certificate of the
// test's own, the client verifying the server) as an ACL user allowed the
// store's prefix and commands and nothing else, on each server of the
// matrix; ACL LOG then holds no denial: the README's ACL line is enough.
func TestRedisStoreConformanceTLSACL(t *testing.T) {
	t.Parallel()
	testenv.EachServer(t, func(t *testing.T, srv testenv.Server) {
		t.Parallel()
		rs := srv.StartTLS(t)
		admin := redis.NewClient(rs.Options())
		t.Cleanup(func() { _ = admin.Close() })
		setUser(t, admin, "idem", aclLine(aclKeys, []string{aclStore, connectRules(srv), aclOps}))
		o := rs.Options()
		o.Username, o.Password = "idem", "secret"
		c := redis.NewClient(o)
		t.Cleanup(func() { _ = c.Close() })
		// Nothing but the store may speak on this client: the test reads
		// what the store needs, not what the test's helpers do.
		t.Run("suite", func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Backend {
				return redisBackend(c, idem.RedisOptions{Prefix: "idem:" + testenv.UniquePrefix()}, nil)
			})
		})
		if d := aclDenials(t, admin, "idem"); len(d) > 0 {
			t.Errorf("ACL LOG after the suite as user idem: %q; want no denial", d)
		}
		// The server speaks TLS alone, and the client verifies it: a client
		// without TLS, or one that does not trust the test's CA, fails.
		for name, tc := range map[string]*tls.Config{"without TLS": nil, "trusting the system's CAs only": {ServerName: "127.0.0.1"}} {
			bad := redis.NewClient(&redis.Options{Addr: rs.Addr, TLSConfig: tc, MaxRetries: -1})
			t.Cleanup(func() { _ = bad.Close() })
			if err := bad.Ping(context.Background()).Err(); err == nil {
				t.Errorf("PING %s = nil; want an error", name)
			}
		}
	})
}

// The same on a Redis Cluster, with the cluster's commands.
func TestRedisStoreConformanceACLCluster(t *testing.T) {
	t.Parallel()
	admin := testenv.Cluster(t)
	user := "idem-" + strings.TrimSuffix(strings.TrimPrefix(testenv.UniquePrefix(), "idemtest:"), ":")
	setUser(t, admin, user, aclLine(aclKeys, []string{aclStore, aclCluster, aclOps}))
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: admin.Options().Addrs, Username: user, Password: "secret"})
	t.Cleanup(func() { _ = c.Close() })
	t.Run("suite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Backend {
			return redisBackend(c, idem.RedisOptions{Prefix: "idem:" + testenv.UniquePrefix()}, nil)
		})
	})
	if d := aclDenials(t, admin, user); len(d) > 0 {
		t.Errorf("ACL LOG after the suite as user %s: %q; want no denial", user, d)
	}
}

// The same with WaitReplicas (WAIT) on Sentinel's master, the user set on
// the master and its replicas alike (ACL users are not replicated).
func TestRedisStoreConformanceACLWaitReplicas(t *testing.T) {
	t.Parallel()
	testenv.Sentinel(t) // it answers
	ctx := context.Background()
	sentinels := strings.Split(testenv.Lookup(t, testenv.SentinelAddrsVar), ",")
	master := testenv.Lookup(t, testenv.SentinelMasterVar)
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinels[0]})
	t.Cleanup(func() { _ = sc.Close() })
	addr, err := sc.GetMasterAddrByName(ctx, master).Result()
	if err != nil {
		t.Fatalf("SENTINEL GET-MASTER-ADDR-BY-NAME = %v", err)
	}
	nodes := []string{addr[0] + ":" + addr[1]}
	replicas, err := sc.Replicas(ctx, master).Result()
	if err != nil {
		t.Fatalf("SENTINEL REPLICAS = %v", err)
	}
	for _, r := range replicas {
		nodes = append(nodes, r["ip"]+":"+r["port"])
	}
	user := "idem-" + strings.TrimSuffix(strings.TrimPrefix(testenv.UniquePrefix(), "idemtest:"), ":")
	rules := aclLine(aclKeys, []string{aclStore, aclWait, aclOps})
	for _, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n})
		t.Cleanup(func() {
			_ = c.Do(context.Background(), "acl", "deluser", user).Err()
			_ = c.Close()
		})
		setUser(t, c, user, rules)
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: sentinels,
		Username: user, Password: "secret"})
	t.Cleanup(func() { _ = c.Close() })
	t.Run("suite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Backend {
			return redisBackend(c, idem.RedisOptions{Prefix: "idem:" + testenv.UniquePrefix(), WaitReplicas: 1}, nil)
		})
	})
	for _, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n})
		t.Cleanup(func() { _ = c.Close() })
		if d := aclDenials(t, c, user); len(d) > 0 {
			t.Errorf("ACL LOG of %s after the suite as user %s: %q; want no denial", n, user, d)
		}
	}
}

// A user without one of the store's permissions gets, at first contact, an
// error that names the command; without CONFIG the eviction check falls
// back to INFO, and without both the store works with a warning. GET and
// PEXPIRE are not used by the probe: their refusal is named by the first
// call that needs them.
func TestRedisACLMissingPermission(t *testing.T) {
	testenv.EachServer(t, testACLMissingPermission)
}

func testACLMissingPermission(t *testing.T, srv testenv.Server) {
	rs := srv.StartTLS(t)
	admin := redis.NewClient(rs.Options())
	t.Cleanup(func() { _ = admin.Close() })
	ctx := context.Background()
	for _, tt := range []struct {
		drop []string
		want error  // Check's error, nil for none
		says string // what the error names
		warn string // what the Logger must say, if anything
	}{
		{drop: []string{"+script|load"}, want: idem.ErrScriptsRefused, says: "'script|load'"},
		{drop: []string{"+evalsha"}, want: idem.ErrScriptsRefused, says: "'evalsha'"},
		{drop: []string{"+time"}, want: idem.ErrScriptsRefused, says: "'time'"},
		{drop: []string{"+set"}, want: idem.ErrScriptsRefused, says: "'set'"},
		{drop: []string{"+del"}, want: idem.ErrScriptsRefused, says: "'del'"},
		{drop: []string{"+pttl"}, want: idem.ErrScriptsRefused, says: "'pttl'"},
		{drop: []string{"+config|get"}},
		{drop: []string{"+info"}},
		{drop: []string{"+config|get", "+info"}, warn: "cannot read Redis maxmemory-policy"},
		{drop: []string{"+get"}, want: idem.ErrScriptsRefused, says: "'get'"},
		{drop: []string{"+pexpire"}, want: idem.ErrScriptsRefused, says: "'pexpire'"},
	} {
		name := strings.Join(tt.drop, ",")
		t.Run("without"+name, func(t *testing.T) {
			user := "idem" + strings.NewReplacer("+", "-", "|", "-", ",", "").Replace(name)
			setUser(t, admin, user, aclLine(aclKeys, []string{aclStore, connectRules(srv)}, tt.drop...))
			o := rs.Options()
			o.Username, o.Password, o.MaxRetries = user, "secret", -1
			c := redis.NewClient(o)
			t.Cleanup(func() { _ = c.Close() })
			var logs bytes.Buffer
			s, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: "idem:" + testenv.UniquePrefix(),
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			err = s.Check(ctx)
			switch {
			case tt.want != nil:
				if !errors.Is(err, tt.want) || !namesCommand(t, err, tt.says) {
					t.Fatalf("Check as a user without %s = %v; want %v naming %s", name, err, tt.want, tt.says)
				}
				// Every call says the same until the user is fixed.
				if _, err := s.Claim(ctx, "k", nil); !errors.Is(err, tt.want) {
					t.Errorf("Claim as a user without %s = %v; want %v", name, err, tt.want)
				}
				return
			case err != nil:
				t.Fatalf("Check as a user without %s = %v; want nil", name, err)
			}
			// The test's servers persist nothing: that warning is not
			// the permissions'.
			if !strings.Contains(logs.String(), tt.warn) {
				t.Errorf("the Logger says %q; want it to say %q", logs.String(), tt.warn)
			} else if tt.warn == "" && strings.Contains(logs.String(), "maxmemory-policy") {
				t.Errorf("the Logger says %q; want no word of maxmemory-policy", logs.String())
			}
			cl, err := s.Claim(ctx, "k", nil)
			if err == nil {
				err = s.Confirm(ctx, cl.Lease, []byte("r"))
			}
			if err != nil {
				t.Errorf("Claim+Confirm as a user without %s = %v; want nil", name, err)
			}
		})
	}
}

// scriptLine matches where Redis 7.0 says a script's command was refused:
// it names the script's line, not the command.
var scriptLine = regexp.MustCompile(`script: ([0-9a-f]{40}), on @user_script:([0-9]+)`)

// namesCommand reports whether err names the refused command quoted
// ('get'): in words, or, as Redis 7.0 says it of a command in a script, by
// the line of one of the store's scripts that calls it.
func namesCommand(t *testing.T, err error, quoted string) bool {
	t.Helper()
	if strings.Contains(err.Error(), quoted) {
		return true
	}
	m := scriptLine.FindStringSubmatch(err.Error())
	if m == nil {
		return false
	}
	n, _ := strconv.Atoi(m[2])
	call := "redis.call(" + strings.ToUpper(quoted)
	files, _ := filepath.Glob("scripts/*.lua")
	record, _ := os.ReadFile("scripts/record.lua")
	for _, f := range files {
		// The store runs each script with record.lua included at its
		// include line: the line numbers are those of the whole.
		src, _ := os.ReadFile(f)
		whole := strings.Replace(string(src), "-- #include record.lua\n", string(record), 1)
		lines := strings.Split(whole, "\n")
		if n <= len(lines) && strings.Contains(lines[n-1], call) {
			t.Logf("%v: line %d of %s as run, which calls %s", err, n, filepath.Base(f), quoted)
			return true
		}
	}
	return false
}

// The README prints the ACL line these tests use.
func TestREADMEPrintsACLLine(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	line := "ACL SETUSER idem on >password " + aclKeys + " resetchannels -@all " + aclStore
	for _, want := range []string{line, aclConnect, aclWait, aclCluster, aclOps} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("README.md does not say %q; want it to print the ACL line the tests use", want)
		}
	}
}
