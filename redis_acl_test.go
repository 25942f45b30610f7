package idem_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/storetest"
)

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
	aclCluster = "+cluster|info +cluster|slots +command"
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
	read := func(ctx context.Context, c *redis.Client) error {
		v, err := c.Do(ctx, "acl", "log").Slice()
		if err != nil {
			return err
		}
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
	testenv.EachServer(t, func(t *testing.T, srv testenv.Server) {
		rs := srv.StartTLS(t)
		admin := redis.NewClient(rs.Options())
		t.Cleanup(func() { _ = admin.Close() })
		setUser(t, admin, "idem", aclLine(aclKeys, []string{aclStore, connectRules(srv)}))
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
	admin := testenv.Cluster(t)
	user := "idem-" + strings.TrimSuffix(strings.TrimPrefix(testenv.UniquePrefix(), "idemtest:"), ":")
	setUser(t, admin, user, aclLine(aclKeys, []string{aclStore, aclCluster}))
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
	rules := aclLine(aclKeys, []string{aclStore, aclWait})
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
	for _, want := range []string{line, aclConnect, aclWait, aclCluster} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("README.md does not say %q; want it to print the ACL line the tests use", want)
		}
	}
}
