package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// checkPrefix reads the throwaway prefix idem check reported.
var checkPrefix = regexp.MustCompile(`throwaway prefix (\S+)`)

// wantClean fails t unless c holds no key of the throwaway prefix that the
// report r names: idem check cleans up after itself.
func wantClean(t *testing.T, c redis.UniversalClient, r result) {
	t.Helper()
	m := checkPrefix.FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("idem check's report names no throwaway prefix: %q", r.stdout)
	}
	var (
		mu   sync.Mutex
		left []string
	)
	scan := func(ctx context.Context, c *redis.Client) error {
		keys, _, err := c.Scan(ctx, 0, m[1]+"*", 100000).Result()
		mu.Lock()
		left = append(left, keys...)
		mu.Unlock()
		return err
	}
	ctx := context.Background()
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, scan)
	} else {
		err = scan(ctx, c.(*redis.Client))
	}
	if err != nil || len(left) > 0 {
		t.Errorf("after idem check, SCAN %s* = %d keys (%v); want none", m[1], len(left), err)
	}
}

// figures returns the report's lines of latency and Redis CPU, for the
// test's log.
func figures(out string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "latency") || strings.HasPrefix(l, "Redis CPU") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// wantPass fails t unless the report passed with every part present.
func wantPass(t *testing.T, args []string, r result) {
	t.Helper()
	if r.code != exitOK || !strings.HasSuffix(r.stdout, "\nidem check: PASS\n") {
		t.Fatalf("idem %q = %d, stdout:\n%s\nstderr: %q; want 0 and PASS", args, r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"\nprobe         pass", "\nconformance   pass", "  pass   Linearizable",
		" 0 violations", "\nlatency       pass  ", " ms median", "\ncleanup       "} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("idem %q stdout:\n%s\nwant it to say %q", args, r.stdout, want)
		}
	}
}

// idem check passes on each server of the matrix, reports its figures, and
// leaves no key behind. The tests that run the whole suite, which waits in
// real time, run one at a time: side by side they would load the machine
// and the servers enough to make its expiry checks miss.
func TestCheckServers(t *testing.T) {
	testenv.EachServer(t, func(t *testing.T, srv testenv.Server) {
		c := srv.Client(t)
		args := []string{"check", "--redis", srv.Addr(t), "--ops", "500"}
		r := runCLI(t, nil, args...)
		wantPass(t, args, r)
		if !strings.Contains(r.stdout, "\nRedis CPU     pass  ") || !strings.Contains(r.stdout, "µs per Claim+Confirm") {
			t.Errorf("idem check stdout:\n%s\nwant the Redis CPU per Claim+Confirm", r.stdout)
		}
		t.Logf("%s:\n%s", srv.Name, figures(r.stdout))
		wantClean(t, c, r)
	})
}

// idem check on a SQL server: the probe, the suite (each check on a table
// of its own) and the latency pass, and no throwaway table is left.
func TestCheckSQL(t *testing.T) {
	for _, c := range []struct {
		flag    string
		dialect sqlstore.Dialect
		dsn     func(testing.TB) string
	}{{"postgres", sqlstore.Postgres, testenv.PostgresDSN}, {"mysql", sqlstore.MySQL, testenv.MySQLDSN}} {
		t.Run(c.flag, func(t *testing.T) {
			table := "chk_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
			args := []string{"check", "--" + c.flag, c.dsn(t), "--table", table, "--ops", "100"}
			r := runCLI(t, nil, args...)
			wantPass(t, args, r)
			if !regexp.MustCompile(`\ncleanup       pass  dropped [1-9][0-9]* tables ` + table + `_check_`).MatchString(r.stdout) {
				t.Errorf("idem check stdout:\n%s\nwant its throwaway tables dropped", r.stdout)
			}
			db := sqltest.Open(t, c.dialect)
			var left int
			q := "SELECT count(*) FROM information_schema.tables WHERE table_name LIKE '" + table + "%'"
			if err := db.QueryRow(q).Scan(&left); err != nil || left != 0 {
				t.Errorf("tables %s* left after idem check = %d, %v; want 0", table, left, err)
			}
			t.Logf("%s:\n%s", c.flag, figures(r.stdout))
		})
	}
}

func TestCheckCluster(t *testing.T) {
	c := testenv.Cluster(t)
	args := []string{"check", "--cluster", strings.Join(c.Options().Addrs, ","), "--ops", "300"}
	r := runCLI(t, nil, args...)
	wantPass(t, args, r)
	t.Logf("cluster:\n%s", figures(r.stdout))
	wantClean(t, c, r)
}

// Sentinel's master, found by the Sentinels.
func TestCheckSentinel(t *testing.T) {
	c := testenv.Sentinel(t)
	args := []string{"check", "--sentinel", testenv.Lookup(t, testenv.SentinelAddrsVar),
		"--master", testenv.Lookup(t, testenv.SentinelMasterVar), "--ops", "300"}
	r := runCLI(t, nil, args...)
	wantPass(t, args, r)
	if !strings.Contains(r.stdout, "of the Sentinels at ") {
		t.Errorf("idem check stdout:\n%s\nwant it to name the Sentinels' master", r.stdout)
	}
	wantClean(t, c, r)
}

// A server that may evict records fails the probe, named, and exit status
// 1; the rest is not run.
func TestCheckEvictingServer(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t, "--maxmemory-policy", "allkeys-lru")
	args := []string{"check", "--redis", srv.Addr}
	r := runCLI(t, nil, args...)
	if r.code != exitFailed || !strings.Contains(r.stdout, `probe         FAIL  idem: Redis may evict records: maxmemory-policy is "allkeys-lru"`) ||
		!strings.HasSuffix(r.stdout, "\nidem check: FAIL (probe)\n") {
		t.Errorf("idem %q = %d, stdout:\n%s\nwant 1, the probe's ErrEviction named, FAIL (probe)", args, r.code, r.stdout)
	}
}

// A server with CONFIG renamed away, as managed services have it, passes:
// the eviction policy is read from INFO.
func TestCheckWithoutConfig(t *testing.T) {
	srv := testenv.StartRedisServer(t, "--rename-command", "CONFIG", "")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.ConfigGet(context.Background(), "maxmemory-policy").Err(); err == nil {
		t.Fatalf("CONFIG GET on a server with CONFIG renamed = nil; want it refused")
	}
	args := []string{"check", "--redis", srv.Addr, "--ops", "100"}
	r := runCLI(t, nil, args...)
	wantPass(t, args, r)
	if !strings.Contains(r.stdout, "maxmemory-policy noeviction") {
		t.Errorf("idem check stdout:\n%s\nwant the policy read from INFO: noeviction", r.stdout)
	}
}

// Over TLS (a rediss:// URL) as an ACL user with the README's line and
// +ping: it passes; without SCAN and UNLINK the cleanup says what it left
// to expire.
func TestCheckTLSACL(t *testing.T) {
	srv := testenv.Servers[0].StartTLS(t)
	admin := redis.NewClient(srv.Options())
	t.Cleanup(func() { _ = admin.Close() })
	err := admin.Do(context.Background(), "acl", "setuser", "idem", "on", ">secret", "~idem:*", "resetchannels", "-@all",
		"+evalsha", "+script|load", "+set", "+get", "+del", "+pttl", "+pexpire", "+time", "+config|get", "+info", "+ping").Err()
	if err != nil {
		t.Fatalf("ACL SETUSER = %v", err)
	}
	// The test's CA is not the system's: the URL skips verification, which
	// the store's own TLS tests do not.
	args := []string{"check", "--redis", "rediss://idem:secret@" + srv.Addr + "?skip_verify=true", "--ops", "100"}
	r := runCLI(t, nil, args...)
	wantPass(t, args, r)
	if !strings.Contains(r.stdout, "cleanup       warn  deleted 0 keys") || !strings.Contains(r.stdout, "'scan'") {
		t.Errorf("idem check stdout:\n%s\nwant the cleanup to say SCAN was refused and the keys left to expire", r.stdout)
	}
}

func TestCheckUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"check"}, "no server given"},
		{[]string{"check", "--redis", "127.0.0.1:" + testenv.FreePort(t)}, "cannot reach Redis"},
		{[]string{"check", "--redis", "127.0.0.1:1", "--ops", "0"}, "--ops 0"},
		{[]string{"check", "--sqlite", "x"}, "unknown flag --sqlite"},
		{[]string{"check", "--mysql", "root@tcp(127.0.0.1:" + testenv.FreePort(t) + ")/x"}, "cannot reach MySQL"},
		{[]string{"check", "--mysql", "root@tcp(127.0.0.1:1)/x", "--table", strings.Repeat("t", 50)}, "--table \"" + strings.Repeat("t", 50) + "\": too long"},
		{[]string{"check", "--redis", "127.0.0.1:1", "--prefix", "a{b"}, `--prefix "a{b" must not contain '{'`},
		{[]string{"check", "--sentinel", "127.0.0.1:1"}, "--sentinel without --master"},
		{[]string{"check", "--master", "m"}, "--master without --sentinel"},
		{[]string{"check", "--sentinel", "127.0.0.1:1", "--master", "m", "--redis", "127.0.0.1:2"}, "give one of --redis, --cluster, --postgres, --mysql and --sentinel"},
		{[]string{"check", "--sentinel", "127.0.0.1", "--master", "m"}, `--sentinel "127.0.0.1": no port`},
		{[]string{"check", "--sentinel", "127.0.0.1:" + testenv.FreePort(t), "--master", "m"}, "cannot reach Redis master \"m\""},
	} {
		r := runCLI(t, nil, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.says) {
			t.Errorf("idem %q = %d %q; want 2 and a line saying %q", tc.args, r.code, r.stderr, tc.says)
		}
		r.wantOneLine(t, tc.args)
	}
}
