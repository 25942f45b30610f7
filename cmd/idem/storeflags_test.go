package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httprecord"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// miniredisWithKey returns the address of a miniredis holding a confirmed
// record of key.
func miniredisWithKey(t *testing.T, key string) string {
	t.Helper()
	m := miniredis.RunT(t)
	rc := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	s, err := idem.NewRedisStore(rc, idem.RedisOptions{})
	if err != nil {
		t.Fatalf("NewRedisStore = %v", err)
	}
	confirm(t, s, key, nil, []byte("done"))
	return m.Addr()
}

// Every command that takes --redis takes a bare host:port and the URL
// forms, from the flag or from the one variable IDEM_REDIS_ADDR, which bench
// reads too.
func TestRedisFlagForms(t *testing.T) {
	t.Parallel()
	addr := miniredisWithKey(t, "forms:1")
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"host:port", nil, []string{"--redis", addr}},
		{"URL", nil, []string{"--redis", "redis://" + addr}},
		{"URL with db 0", nil, []string{"--redis", "redis://" + addr + "/0"}},
		{"env host:port", map[string]string{envRedisAddr: addr}, nil},
		{"env URL", map[string]string{envRedisAddr: "redis://" + addr}, nil},
	} {
		args := append(append([]string{"inspect"}, tc.args...), "forms:1")
		r := runCLI(t, tc.env, args...)
		if r.code != exitOK || !strings.Contains(r.stdout, "state        confirmed") || r.stderr != "" {
			t.Errorf("%s: idem %q (env %v) = %d %q %q; want 0 and the confirmed record", tc.name, args, tc.env, r.code, r.stdout, r.stderr)
		}
	}
}

// The variable of earlier releases still works, with a note saying which
// one to set instead; the new one wins when both are set.
func TestRedisOldEnv(t *testing.T) {
	t.Parallel()
	addr := miniredisWithKey(t, "old-env:1")
	r := runCLI(t, map[string]string{envRedisURLOld: "redis://" + addr}, "inspect", "old-env:1")
	if r.code != exitOK || !strings.Contains(r.stdout, "state        confirmed") ||
		!strings.Contains(r.stderr, envRedisURLOld+" is deprecated") || !strings.Contains(r.stderr, "set "+envRedisAddr) {
		t.Errorf("inspect with %s = %d %q %q; want the record and a deprecation note naming %s", envRedisURLOld, r.code, r.stdout, r.stderr, envRedisAddr)
	}
	r.wantOneLine(t, []string{"inspect", "old-env:1"})
	r = runCLI(t, map[string]string{envRedisURLOld: "redis://127.0.0.1:1", envRedisAddr: addr}, "inspect", "old-env:1")
	if r.code != exitOK || r.stderr != "" {
		t.Errorf("inspect with %s and %s = %d %q; want %s used, no note", envRedisURLOld, envRedisAddr, r.code, r.stderr, envRedisAddr)
	}
	path, _ := sqliteFile(t, idem.Options{})
	r = runCLI(t, map[string]string{envRedisURLOld: "redis://" + addr}, "inspect", "--sqlite", path, "old-env:1")
	if strings.Contains(r.stderr, "deprecated") {
		t.Errorf("inspect --sqlite with %s set = %q; want no note about a variable it does not use", envRedisURLOld, r.stderr)
	}
}

// A bad address is a usage error before any I/O that names the flag and
// the value and shows the accepted forms, never url.Parse's own message
// (which quotes the URL again, password included).
func TestStoreFlagErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		says []string
	}{
		{[]string{"demo", "--redis", "localhost"}, []string{`--redis "localhost": no port`, redisForms}},
		{[]string{"demo", "--redis", "127.0.0.1:port"}, []string{`"127.0.0.1:port"`, "not a number", redisForms}},
		{[]string{"serve", "--redis", ":6379"}, []string{"no host", redisForms}},
		{[]string{"inspect", "k", "--redis", "mysql://h:1"}, []string{`unknown scheme "mysql"`, redisForms}},
		{[]string{"inspect", "k", "--redis", "redis://user:s3cret@h:abc"}, []string{`"redis://user:xxxxx@h:abc"`, `invalid port ":abc"`, redisForms}},
		{[]string{"demo", "http", "--redis", "redis://h:1/x"}, []string{"--redis", redisForms}},
		{[]string{"bench", "--groups", "http", "--redis", "h"}, []string{`--redis "h": no port`, redisForms}},
		{[]string{"demo", "--cluster", "127.0.0.1:1,,127.0.0.1:2"}, []string{"an empty address", clusterForms}},
		{[]string{"demo", "--cluster", "127.0.0.1:1,h"}, []string{`--cluster "h": no port`}},
		{[]string{"demo", "--cluster", "redis://127.0.0.1:1/3"}, []string{"only database 0"}},
		{[]string{"bench", "--groups", "cluster", "--cluster", "a:1,b"}, []string{`--cluster "b": no port`}},
		{[]string{"demo", "--sqlite", "file://otherhost/x.db"}, []string{`authority "otherhost"`, sqliteForms}},
	} {
		r := runCLI(t, nil, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "see `idem") {
			t.Errorf("idem %q = %d %q; want a usage error (%d)", tc.args, r.code, r.stderr, exitUsage)
		}
		for _, s := range tc.says {
			if !strings.Contains(r.stderr, s) {
				t.Errorf("idem %q stderr = %q; want it to say %q", tc.args, r.stderr, s)
			}
		}
		for _, raw := range []string{`parse "`, "s3cret", "cannot reach"} {
			if strings.Contains(r.stderr, raw) {
				t.Errorf("idem %q stderr = %q; want no %q", tc.args, r.stderr, raw)
			}
		}
		r.wantOneLine(t, tc.args)
	}
}

// A store flag on the command line overrides the other stores' variables
// (a shell with make services-up's exports still runs idem ... --sqlite);
// two variables and no flag are refused, naming the variables.
func TestStoreFlagOverridesOtherEnv(t *testing.T) {
	t.Parallel()
	path, s := sqliteFile(t, idem.Options{})
	confirm(t, s, "override:1", nil, nil)
	env := map[string]string{envRedisAddr: "127.0.0.1:1", envClusterAddrs: "127.0.0.1:2", envPostgresDSN: "postgres://nobody@127.0.0.1:3/x"}
	r := runCLI(t, env, "inspect", "--sqlite", path, "override:1")
	if r.code != exitOK || !strings.Contains(r.stdout, "state        confirmed") {
		t.Errorf("inspect --sqlite with three store variables set = %d %q %q; want the SQLite record", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "inspect", "override:1")
	if r.code != exitUsage || !strings.Contains(r.stderr, envRedisAddr+" and "+envClusterAddrs+" and "+envPostgresDSN+" each name a store") {
		t.Errorf("inspect with three store variables and no flag = %d %q; want a usage error naming the variables", r.code, r.stderr)
	}
	args := []string{"inspect", "--sqlite", path, "--redis", "127.0.0.1:1", "override:1"}
	if r := runCLI(t, nil, args...); r.code != exitUsage || !strings.Contains(r.stderr, "at most one") {
		t.Errorf("idem %q = %d %q; want at most one store flag", args, r.code, r.stderr)
	}
}

// --sqlite takes a path or a file: URI (as sqlstore's docs open SQLite,
// with _pragma options); the store's pragmas are added to a URI that does
// not set them, and a path with ?, # or % names that file, not a query.
func TestSQLiteFlagForms(t *testing.T) {
	t.Parallel()
	path, s := sqliteFile(t, idem.Options{})
	confirm(t, s, "uri:1", nil, nil)
	for _, v := range []string{path, "file:" + path, "file://" + path, "file:" + path + "?_pragma=busy_timeout(5000)", "file://localhost" + path} {
		args := []string{"inspect", "--sqlite", v, "uri:1"}
		r := runCLI(t, nil, args...)
		if r.code != exitOK || !strings.Contains(r.stdout, "state        confirmed") || !strings.Contains(r.stdout, "uri:1") {
			t.Errorf("idem %q = %d %q %q; want the record", args, r.code, r.stdout, r.stderr)
		}
	}
	args := []string{"inspect", "--sqlite", "file:" + filepath.Join(t.TempDir(), "missing.db"), "uri:1"}
	if r := runCLI(t, nil, args...); r.code != exitUsage || !strings.Contains(r.stderr, "no such file") {
		t.Errorf("idem %q = %d %q; want exit 2, no such file", args, r.code, r.stderr)
	}

	// demo creates the database: from a URI without pragmas (WAL added,
	// or sqlstore.New would refuse the file), and from a path that a URI
	// would misread.
	dir := t.TempDir()
	for _, tc := range []struct{ flag, file string }{
		{"file:" + filepath.Join(dir, "from-uri.db") + "?_pragma=busy_timeout(5000)", filepath.Join(dir, "from-uri.db")},
		{filepath.Join(dir, "odd?name#1%41.db"), filepath.Join(dir, "odd?name#1%41.db")},
	} {
		args := []string{"demo", "--sqlite", tc.flag, "--messages", "40", "--workers", "2", "--crash-rate", "0.1"}
		r := runCLI(t, nil, args...)
		if r.code != exitOK {
			t.Errorf("idem %q = %d\n%s%s", args, r.code, r.stdout, r.stderr)
		}
		if _, err := os.Stat(tc.file); err != nil {
			t.Errorf("idem %q: %v; want the database at %q", args, err, tc.file)
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if n := e.Name(); !strings.HasPrefix(n, "from-uri.db") && !strings.HasPrefix(n, "odd?name#1%41.db") {
			t.Errorf("demo left %q in %s; want only the files it was given (and their -wal, -shm)", n, dir)
		}
	}
}

// sqliteDSN's translations, and its refusals.
func TestSQLiteDSN(t *testing.T) {
	t.Parallel()
	const pragmas = "_pragma=journal_mode%28WAL%29&_pragma=synchronous%28NORMAL%29"
	for _, tc := range []struct{ in, dsn, path string }{
		{"idem.db", "file:idem.db?" + pragmas, "idem.db"},
		{"/var/lib/a?b.db", "file:///var/lib/a%3fb.db?" + pragmas, "/var/lib/a?b.db"},
		{"file:/x/i.db", "file:/x/i.db?" + pragmas, "/x/i.db"},
		{"file:///x/i%20j.db", "file:///x/i%20j.db?" + pragmas, "/x/i j.db"},
		{"file:i.db?_pragma=journal_mode(WAL)&mode=rw", "file:i.db?_pragma=journal_mode%28WAL%29&_pragma=synchronous%28NORMAL%29&mode=rw", "i.db"},
		{"file:i.db?_pragma=synchronous(FULL)", "file:i.db?_pragma=synchronous%28FULL%29&_pragma=journal_mode%28WAL%29", "i.db"},
	} {
		dsn, path, err := sqliteDSN(tc.in)
		if err != nil || dsn != tc.dsn || path != tc.path {
			t.Errorf("sqliteDSN(%q) = %q, %q, %v; want %q, %q", tc.in, dsn, path, err, tc.dsn, tc.path)
		}
	}
	for _, in := range []string{"", "file://h/x.db", "file:/x%zz.db"} {
		if _, _, err := sqliteDSN(in); err == nil || !strings.Contains(err.Error(), sqliteForms) {
			t.Errorf("sqliteDSN(%q) = %v; want an error showing %q", in, err, sqliteForms)
		}
	}
}

// helpFlags returns the flags a --help output lists.
func helpFlags(help string) []string {
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+)`).FindAllStringSubmatch(help, -1) {
		names = append(names, m[1])
	}
	return names
}

// Each command's --help lists the flags it takes and none it refuses; a
// flag another command has says why this one has none.
func TestHelpListsOnlyAcceptedFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cmd       []string
		want, not []string
		notEnv    []string
	}{
		{[]string{"prune"}, []string{"postgres", "mysql", "sqlite", "table", "timeout"}, []string{"redis", "cluster", "prefix"}, []string{envRedisAddr, envClusterAddrs, envRedisPrefix}},
		{[]string{"bench"}, []string{"redis", "cluster", "postgres"}, []string{"sqlite", "table", "prefix"}, []string{envSQLiteFile, envTable, envRedisPrefix}},
		{[]string{"schema"}, []string{"dialect", "mysql", "table"}, []string{"redis", "cluster", "postgres", "sqlite", "prefix"}, nil},
		{[]string{"demo"}, []string{"redis", "cluster", "postgres", "mysql", "sqlite", "table", "prefix"}, nil, nil},
		{[]string{"demo", "http"}, []string{"redis", "cluster", "postgres", "mysql", "sqlite", "table", "prefix"}, nil, nil},
		{[]string{"serve"}, []string{"redis", "cluster", "postgres", "mysql", "sqlite", "table", "prefix"}, nil, nil},
		{[]string{"inspect"}, []string{"redis", "cluster", "postgres", "mysql", "sqlite", "table", "prefix", "http", "scope"}, nil, nil},
	} {
		r := runCLI(t, nil, append(tc.cmd, "--help")...)
		listed := helpFlags(r.stdout)
		for _, f := range tc.want {
			if !slices.Contains(listed, f) {
				t.Errorf("idem %s --help lists %v; want --%s", tc.cmd, listed, f)
			}
		}
		for _, f := range tc.not {
			if slices.Contains(listed, f) {
				t.Errorf("idem %s --help lists --%s, which it does not take", tc.cmd, f)
			}
			args := append(slices.Clone(tc.cmd), "--"+f, "x")
			r := runCLI(t, nil, args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, "--"+f) {
				t.Errorf("idem %q = %d %q; want a usage error naming --%s", args, r.code, r.stderr, f)
			}
		}
		for _, v := range tc.notEnv {
			if strings.Contains(r.stdout, v) {
				t.Errorf("idem %s --help mentions %s, the variable of a flag it does not take", tc.cmd, v)
			}
		}
	}
	r := runCLI(t, nil, "prune", "--redis", "127.0.0.1:1")
	if !strings.Contains(r.stderr, "Redis expires its keys itself") {
		t.Errorf("prune --redis = %q; want why prune has no --redis", r.stderr)
	}
}

// inspect KEY on a key the middleware recorded (under its scope) says how to find it with --http; --http without --scope on a
// scoped record suggests --scope. A key that is already the store's
// encoding gets no such hint.
func TestInspectSuggestsHTTP(t *testing.T) {
	t.Parallel()
	path, s := sqliteFile(t, idem.Options{})
	resp := httprecord.Encode(&httprecord.Response{Status: 201, Body: []byte(`{"id":9}`)})
	confirm(t, s, httprecord.Key("acme", "ord-9"), nil, resp)
	args := []string{"inspect", "--sqlite", path}

	r := runCLI(t, nil, append(args, "ord-9")...)
	if r.code != exitFailed || !strings.Contains(r.stderr, "no live record") ||
		!strings.Contains(r.stderr, "idem inspect --http 'METHOD ROUTE' [--scope TENANT] ord-9") {
		t.Errorf("inspect ord-9 = %d %q; want no live record and the --http command to try", r.code, r.stderr)
	}
	r.wantOneLine(t, args)

	r = runCLI(t, nil, append(args, "--http", "POST /orders", "ord-9")...)
	if r.code != exitFailed || !strings.Contains(r.stderr, "--scope TENANT") {
		t.Errorf("inspect --http without --scope = %d %q; want a hint to give --scope", r.code, r.stderr)
	}
	r = runCLI(t, nil, append(args, "--http", "POST /orders", "--scope", "acme", "ord-9")...)
	if r.code != exitOK || !strings.Contains(r.stdout, "state        confirmed") {
		t.Errorf("inspect --http --scope acme ord-9 = %d %q %q; want the record", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, nil, append(args, httprecord.Key("", "ord-9"))...)
	if r.code != exitFailed || strings.Contains(r.stderr, "--http") {
		t.Errorf("inspect of a missing encoded key = %d %q; want no --http hint", r.code, r.stderr)
	}
}

// A Redis Cluster's masters may be given as host:port or as URLs.
func TestClusterFlagURLs(t *testing.T) {
	t.Parallel()
	addrs := strings.Split(testenv.Lookup(t, testenv.ClusterAddrsVar), ",")
	for i, a := range addrs {
		addrs[i] = "redis://" + a
	}
	args := []string{"inspect", "--cluster", strings.Join(addrs, ","), "cmd-flags-cluster-url:none"}
	r := runCLI(t, nil, args...)
	if r.code != exitFailed || !strings.Contains(r.stderr, "no live record in Redis Cluster") {
		t.Errorf("idem %q = %d %q; want the cluster reached and no record (%d)", args, r.code, r.stderr, exitFailed)
	}
}

// The build tags that leave the SQL drivers out leave out their packages
// (the demo's default store needs neither), and a command given that
// store says which tag did it.
func TestDriverBuildTags(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is not on PATH: %v", err)
	}
	tags := tagNoPostgres + "," + tagNoSQLite + "," + tagNoMySQL
	out, err := exec.Command(goTool, "list", "-deps", "-tags", tags, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps -tags %s: %v\n%s", tags, err, out)
	}
	for _, pkg := range []string{"github.com/jackc/pgx/v5/stdlib", "modernc.org/sqlite", "modernc.org/libc", "github.com/go-sql-driver/mysql"} {
		if slices.Contains(strings.Fields(string(out)), pkg) {
			t.Errorf("go list -deps -tags %s lists %s; want it left out", tags, pkg)
		}
	}

	// Not parallel: it swaps the drivers out for the length of the test.
	pg, my, lite := postgresDriver, mysqlDriver, sqliteDriver
	postgresDriver, mysqlDriver, sqliteDriver = "", "", ""
	defer func() { postgresDriver, mysqlDriver, sqliteDriver = pg, my, lite }()
	for _, tc := range []struct {
		args []string
		tag  string
	}{
		{[]string{"demo", "--sqlite", "x.db"}, tagNoSQLite},
		{[]string{"prune", "--postgres", "postgres://127.0.0.1:1/x"}, tagNoPostgres},
		{[]string{"prune", "--mysql", "idem@tcp(127.0.0.1:1)/x"}, tagNoMySQL},
		{[]string{"bench", "--groups", "sql", "--postgres", "postgres://127.0.0.1:1/x"}, tagNoPostgres},
	} {
		r := runCLI(t, nil, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "built with -tags "+tc.tag) {
			t.Errorf("idem %q without the driver = %d %q; want a usage error naming %s", tc.args, r.code, r.stderr, tc.tag)
		}
	}
}

// --mysql takes go-sql-driver's DSN as it is and a mysql:// URL rewritten
// to it; a host:port outside tcp(...) is refused naming both forms, not
// left to the driver's "default addr for network ... unknown".
func TestMySQLDSN(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"root@tcp(127.0.0.1:13306)/idem", "root@tcp(127.0.0.1:13306)/idem"},
		{"u:p@tcp(db:3306)/idem?interpolateParams=true", "u:p@tcp(db:3306)/idem?interpolateParams=true"},
		{"u:p@/idem", "u:p@/idem"},
		{"u@unix(/run/mysqld/mysqld.sock)/idem", "u@unix(/run/mysqld/mysqld.sock)/idem"},
		{"mysql://root@127.0.0.1:33306/idem", "root@tcp(127.0.0.1:33306)/idem"},
		{"mysql://u:p%40ss@db/idem?interpolateParams=true", "u:p@ss@tcp(db:3306)/idem?interpolateParams=true"},
		{"mariadb://[::1]:3307/idem", "tcp([::1]:3307)/idem"},
	} {
		if got, err := mysqlDSN(tc.in); got != tc.want || err != nil {
			t.Errorf("mysqlDSN(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "root@127.0.0.1:33306/idem", "127.0.0.1:3306/idem", "root@tcp(db:3306)", "mysql:///idem", "postgres://u@h/db"} {
		if _, err := mysqlDSN(in); err == nil || !strings.Contains(err.Error(), mysqlForms) {
			t.Errorf("mysqlDSN(%q) = %v; want an error naming %q", in, err, mysqlForms)
		}
	}
}
