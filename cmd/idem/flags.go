package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/sqlstore"
)

// The environment variables that stand in for the connection flags, one per
// store. A flag given on the command line wins over its variable.
const (
	envRedisAddr    = "IDEM_REDIS_ADDR"
	envClusterAddrs = "IDEM_REDIS_CLUSTER_ADDRS"
	envPostgresDSN  = "IDEM_POSTGRES_DSN"
	envSQLiteFile   = "IDEM_SQLITE_FILE"
	envTable        = "IDEM_TABLE"
	envRedisPrefix  = "IDEM_REDIS_PREFIX"
	// envRedisURLOld is the Redis variable of earlier releases, read when
	// envRedisAddr is unset, with a note that it is deprecated: bench read
	// envRedisAddr and the other commands this one, for the same Redis.
	envRedisURLOld = "IDEM_REDIS_URL"
)

// The forms a store flag accepts, for its help and its errors.
const (
	redisForms   = "host:port, redis://[user:pass@]host:port[/db], rediss://... (TLS) or unix:///path"
	clusterForms = "comma-separated host:port or redis:// URLs"
	sqliteForms  = "a file path, or a file: URI such as file:/var/lib/idem.db?_pragma=busy_timeout(5000)"
)

// connectTimeout bounds the first contact with a store: an unreachable store
// is reported as one line and exit status 2, not a hang.
const connectTimeout = 5 * time.Second

// storeKinds is the set of stores a command accepts: it registers their
// flags and no others, so that --help lists only what the command takes.
type storeKinds uint8

const (
	kindRedis storeKinds = 1 << iota
	kindCluster
	kindPostgres
	kindSQLite
	// kindNames adds --prefix (with a Redis kind) and --table (with a SQL
	// kind): how a store names its records.
	kindNames

	kindsSQL = kindPostgres | kindSQLite | kindNames
	kindsAll = kindRedis | kindCluster | kindsSQL
)

// storeFlags are the connection flags shared by the commands. At most one
// of redis, cluster, postgres and sqlite may be set; none means the embedded
// Redis where a command allows it.
type storeFlags struct {
	redisAddr, cluster, postgres, sqlite string
	table, prefix                        string
	// fromEnv maps each store flag whose default came from the
	// environment to its variable: a store flag given on the command line
	// overrides the other stores' variables (a shell that exports them all
	// still runs idem demo --sqlite x.db).
	fromEnv map[string]string
	// redisFromOld is set when --redis defaults to envRedisURLOld.
	redisFromOld bool

	// What chooseStore read: the chosen store's flag name ("" for none) and
	// its parsed address.
	kind                  string
	redisOpts             *redis.Options
	clusterOpts           *redis.ClusterOptions
	sqliteDSN, sqlitePath string
}

// register defines on fs the connection flags of the stores kinds names,
// with defaults from the environment.
func (f *storeFlags) register(fs *flag.FlagSet, getenv func(string) string, kinds storeKinds) {
	f.fromEnv = map[string]string{}
	env := func(name, v string) string {
		if val := getenv(v); val != "" {
			f.fromEnv[name] = v
			return val
		}
		return ""
	}
	if kinds&kindRedis != 0 {
		def := env("redis", envRedisAddr)
		if def == "" && getenv(envRedisURLOld) != "" {
			def, f.redisFromOld = env("redis", envRedisURLOld), true
		}
		fs.StringVar(&f.redisAddr, "redis", def, "a Redis `ADDR`: "+redisForms+" (env "+envRedisAddr+")")
	}
	if kinds&kindCluster != 0 {
		fs.StringVar(&f.cluster, "cluster", env("cluster", envClusterAddrs), "a Redis Cluster's masters, `ADDRS`: "+clusterForms+" (env "+envClusterAddrs+")")
	}
	if kinds&(kindRedis|kindCluster) != 0 && kinds&kindNames != 0 {
		fs.StringVar(&f.prefix, "prefix", or(getenv(envRedisPrefix), idem.DefaultPrefix), "the Redis key `prefix` of the store (env "+envRedisPrefix+")")
	}
	if kinds&kindPostgres != 0 {
		fs.StringVar(&f.postgres, "postgres", env("postgres", envPostgresDSN), "a Postgres `DSN`: postgres://user@host:port/db or 'host=... dbname=...' (env "+envPostgresDSN+")")
	}
	if kinds&kindSQLite != 0 {
		fs.StringVar(&f.sqlite, "sqlite", env("sqlite", envSQLiteFile), "a SQLite database `FILE`: "+sqliteForms+" (env "+envSQLiteFile+")")
	}
	if kinds&(kindPostgres|kindSQLite) != 0 && kinds&kindNames != 0 {
		fs.StringVar(&f.table, "table", or(getenv(envTable), sqlstore.DefaultTable), "the SQL `table` of the store (env "+envTable+")")
	}
}

// chooseStore runs after fs is parsed and before any I/O: it lets a store
// flag given on the command line override the other stores' environment
// variables, reads the chosen store's address, and says once on stderr that
// envRedisURLOld is deprecated when the command is about to use it. Its
// error is a usage error.
func (c *cli) chooseStore(cmd string, fs *flag.FlagSet, f *storeFlags) error {
	explicit := givenFlags(fs)
	type given struct{ flag, value string }
	var set []given
	for _, g := range []given{{"redis", f.redisAddr}, {"cluster", f.cluster}, {"postgres", f.postgres}, {"sqlite", f.sqlite}} {
		if g.value != "" {
			set = append(set, g)
		}
	}
	if explicit["redis"] || explicit["cluster"] || explicit["postgres"] || explicit["sqlite"] {
		set = slices.DeleteFunc(set, func(g given) bool { return !explicit[g.flag] })
	}
	switch {
	case len(set) > 1 && !explicit[set[0].flag]:
		var vars []string
		for _, g := range set {
			vars = append(vars, f.fromEnv[g.flag])
		}
		return fmt.Errorf("%s each name a store: give one store flag (--redis, --cluster, --postgres or --sqlite) or unset all but one", strings.Join(vars, " and "))
	case len(set) > 1:
		return errors.New("give at most one of --redis, --cluster, --postgres and --sqlite")
	case len(set) == 0:
		return nil
	}
	f.kind = set[0].flag
	var err error
	switch f.kind {
	case "redis":
		if !explicit["redis"] {
			c.noteOldRedisEnv(cmd, f)
		}
		f.redisOpts, err = parseRedisAddr("--redis", f.redisAddr)
	case "cluster":
		f.clusterOpts, err = parseClusterAddrs("--cluster", f.cluster)
	case "postgres":
		if postgresDriver == "" {
			err = fmt.Errorf("--postgres: this idem was built with -tags %s, without the Postgres driver; build it without that tag", tagNoPostgres)
		}
	case "sqlite":
		if sqliteDriver == "" {
			err = fmt.Errorf("--sqlite: this idem was built with -tags %s, without the SQLite driver; build it without that tag", tagNoSQLite)
		} else {
			f.sqliteDSN, f.sqlitePath, err = sqliteDSN(f.sqlite)
		}
	}
	return err
}

// givenFlags returns the names of the flags given on the command line, as
// opposed to those left at their defaults.
func givenFlags(fs *flag.FlagSet) map[string]bool {
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	return given
}

// noteOldRedisEnv says on stderr that envRedisURLOld is deprecated when
// --redis, about to be used without being given, has its value from it.
func (c *cli) noteOldRedisEnv(cmd string, f *storeFlags) {
	if f.redisFromOld {
		fmt.Fprintf(c.stderr, "idem %s: note: %s is deprecated and will be dropped; set %s (it takes the same URL, or host:port)\n",
			cmd, envRedisURLOld, envRedisAddr)
	}
}

// parseRedisAddr reads a Redis address given to the flag name: a redis://,
// rediss:// or unix:// URL, or a bare host:port. Its errors name the flag
// and the value, and list the accepted forms.
func parseRedisAddr(name, v string) (*redis.Options, error) {
	bad := func(why string) error {
		return fmt.Errorf("%s %q: %s; want %s", name, redactPassword(v), why, redisForms)
	}
	scheme, _, isURL := strings.Cut(v, "://")
	if !isURL {
		host, port, err := net.SplitHostPort(v)
		switch {
		case err != nil && !strings.Contains(v, ":"):
			return nil, bad("no port")
		case err != nil:
			return nil, bad("not host:port")
		case host == "":
			return nil, bad("no host")
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return nil, bad(fmt.Sprintf("port %q is not a number from 1 to 65535", port))
		}
		return &redis.Options{Addr: v}, nil
	}
	switch strings.ToLower(scheme) {
	case "redis", "rediss", "unix":
	default:
		return nil, bad(fmt.Sprintf("unknown scheme %q", scheme))
	}
	// go-redis wraps url.Parse, whose errors quote the whole URL again
	// (password included); the reason alone is what the user needs.
	if _, err := url.Parse(v); err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, bad(err.Error())
	}
	o, err := redis.ParseURL(v)
	if err != nil {
		return nil, bad(strings.TrimPrefix(err.Error(), "redis: "))
	}
	return o, nil
}

// redactPassword hides the password of a URL that an error quotes, even
// one that does not parse: errors end up in logs.
func redactPassword(v string) string {
	scheme, rest, ok := strings.Cut(v, "://")
	if !ok {
		return v
	}
	// The userinfo ends at the last '@' before the path.
	auth, path, hasPath := strings.Cut(rest, "/")
	at := strings.LastIndex(auth, "@")
	if at < 0 {
		return v
	}
	user, _, hasPass := strings.Cut(auth[:at], ":")
	if !hasPass {
		return v
	}
	s := scheme + "://" + user + ":xxxxx" + auth[at:]
	if hasPath {
		s += "/" + path
	}
	return s
}

// parseClusterAddrs reads the masters of a Redis Cluster given to the flag
// name: comma-separated addresses, each as parseRedisAddr takes it. A URL's
// user, password and TLS apply to every master, so they must agree.
func parseClusterAddrs(name, v string) (*redis.ClusterOptions, error) {
	co := &redis.ClusterOptions{}
	for i, a := range strings.Split(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, fmt.Errorf("%s %q: an empty address; want %s", name, v, clusterForms)
		}
		o, err := parseRedisAddr(name, a)
		if err != nil {
			return nil, err
		}
		if o.DB != 0 {
			return nil, fmt.Errorf("%s %q: database %d; a Redis Cluster has only database 0", name, a, o.DB)
		}
		if o.Network == "unix" {
			return nil, fmt.Errorf("%s %q: a Unix socket; want %s", name, a, clusterForms)
		}
		if i == 0 {
			co.Username, co.Password, co.TLSConfig = o.Username, o.Password, o.TLSConfig
		} else if o.Username != co.Username || o.Password != co.Password || (o.TLSConfig == nil) != (co.TLSConfig == nil) {
			return nil, fmt.Errorf("%s %q: its user, password or TLS differ from the first address's; one cluster has one of each", name, a)
		}
		co.Addrs = append(co.Addrs, o.Addr)
	}
	return co, nil
}

// sqliteDSN turns what --sqlite was given into the driver's DSN and the
// file's path. A path is made a file: URI; a file: URI is kept as it is.
// Either way the store's pragmas (WAL, which sqlstore requires, and
// synchronous NORMAL) are added unless the URI sets them itself.
func sqliteDSN(v string) (dsn, path string, err error) {
	bad := func(why string) error {
		return fmt.Errorf("--sqlite %q: %s; want %s", v, why, sqliteForms)
	}
	var query url.Values
	if rest, ok := strings.CutPrefix(v, "file:"); ok {
		p, q, _ := strings.Cut(rest, "?")
		p, _, _ = strings.Cut(p, "#")
		if after, ok := strings.CutPrefix(p, "//"); ok {
			// file://AUTHORITY/path: SQLite takes only an empty authority
			// or localhost.
			auth, abs, _ := strings.Cut(after, "/")
			if auth != "" && auth != "localhost" {
				return "", "", bad(fmt.Sprintf("authority %q; a file: URI names a local file (file:/path or file:///path)", auth))
			}
			p = "/" + abs
		}
		if path, err = url.PathUnescape(p); err != nil {
			return "", "", bad("bad %-escape in the path")
		}
		if query, err = url.ParseQuery(q); err != nil {
			return "", "", bad("bad query")
		}
		dsn = "file:" + strings.TrimPrefix(v, "file:")
		dsn, _, _ = strings.Cut(dsn, "?")
		dsn, _, _ = strings.Cut(dsn, "#")
	} else {
		if v == "" {
			return "", "", bad("empty")
		}
		// In a URI, ? # and % in the path would start the query, the
		// fragment or an escape: escape them so that the file is the one
		// named.
		path, query = v, url.Values{}
		esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(v)
		if strings.HasPrefix(v, "/") {
			dsn = "file://" + esc
		} else {
			dsn = "file:" + esc
		}
	}
	has := func(pragma string) bool {
		for _, p := range query["_pragma"] {
			if strings.HasPrefix(strings.ToLower(strings.TrimSpace(p)), pragma) {
				return true
			}
		}
		return false
	}
	if !has("journal_mode") {
		query.Add("_pragma", "journal_mode(WAL)")
	}
	if !has("synchronous") {
		query.Add("_pragma", "synchronous(NORMAL)")
	}
	return dsn + "?" + query.Encode(), path, nil
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// backend is an open connection to the store the flags named.
type backend struct {
	desc    string // for reports: "embedded Redis (miniredis)", "Redis at host:port", ...
	redis   redis.UniversalClient
	db      *sql.DB
	dialect sqlstore.Dialect
	table   string
	prefix  string
	// allowEviction lets a command that only reads (inspect) work on a
	// Redis whose maxmemory-policy may evict keys; a store that records
	// work refuses such a Redis at first contact (ErrEviction).
	allowEviction bool
	closers       []func()
}

func (b *backend) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

// isSQL reports whether the backend is a SQL database.
func (b *backend) isSQL() bool { return b.db != nil }

// store returns a store on the backend with options o; on SQL the table must
// exist (see createSchema).
func (b *backend) store(o idem.Options) (idem.Store, error) {
	if b.isSQL() {
		return b.sqlStore(o)
	}
	ro := idem.RedisOptionsFrom(o)
	ro.Prefix = b.prefix
	ro.AllowEviction = b.allowEviction
	return idem.NewRedisStore(b.redis, ro)
}

func (b *backend) sqlStore(o idem.Options) (*sqlstore.Store, error) {
	so := sqlstore.OptionsFrom(o, b.dialect)
	so.Table = b.table
	return sqlstore.New(b.db, so)
}

// errNoStore is returned by open when no store was named and the command has
// no embedded default.
var errNoStore = errors.New("no store given: use --redis, --cluster, --postgres or --sqlite (or their environment variables)")

// open connects to the store chooseStore chose, or to an embedded Redis when
// none is named and embedded is true. It checks that the store answers.
// sqliteMustExist refuses a SQLite file that does not exist, so that an
// operator's typo does not silently create an empty database.
func (f *storeFlags) open(ctx context.Context, embedded, sqliteMustExist bool) (*backend, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	b := &backend{prefix: f.prefix, table: f.table}
	switch {
	case f.kind == "redis":
		c := redis.NewClient(f.redisOpts)
		b.redis, b.desc = c, "Redis at "+f.redisOpts.Addr
		b.closers = append(b.closers, func() { _ = c.Close() })
	case f.kind == "cluster":
		c := redis.NewClusterClient(f.clusterOpts)
		b.redis, b.desc = c, "Redis Cluster at "+strings.Join(f.clusterOpts.Addrs, ",")
		b.closers = append(b.closers, func() { _ = c.Close() })
	case f.kind == "postgres":
		db, err := sql.Open(postgresDriver, f.postgres)
		if err != nil {
			return nil, fmt.Errorf("--postgres: %w", err)
		}
		b.db, b.dialect, b.desc = db, sqlstore.Postgres, "Postgres"
		b.closers = append(b.closers, func() { _ = db.Close() })
	case f.kind == "sqlite":
		if sqliteMustExist {
			if _, err := os.Stat(f.sqlitePath); err != nil {
				var pe *fs.PathError
				if errors.As(err, &pe) {
					err = pe.Err
				}
				return nil, fmt.Errorf("--sqlite %q: %w (inspect and prune open an existing database)", f.sqlitePath, err)
			}
		}
		// WAL is what sqlstore.Store requires; it persists in the file.
		db, err := sql.Open(sqliteDriver, f.sqliteDSN)
		if err != nil {
			return nil, fmt.Errorf("--sqlite: %w", err)
		}
		b.db, b.dialect, b.desc = db, sqlstore.SQLite, "SQLite file "+f.sqlitePath
		b.closers = append(b.closers, func() { _ = db.Close() })
	case embedded:
		c, stop, err := startEmbedded()
		if err != nil {
			return nil, err
		}
		b.redis, b.desc = c, "embedded Redis (miniredis, in this process)"
		b.closers = append(b.closers, stop)
	default:
		return nil, errNoStore
	}
	var err error
	if b.isSQL() {
		err = b.db.PingContext(ctx)
	} else {
		err = b.redis.Ping(ctx).Err()
	}
	if err != nil {
		b.close()
		return nil, fmt.Errorf("cannot reach %s: %w", b.desc, err)
	}
	return b, nil
}

// startEmbedded starts an in-process miniredis and a client of it. miniredis
// lets keys expire only when told that time passed, so a clock goroutine
// fast-forwards it to follow real time: leases run out and are taken over as
// on a real Redis. stop ends the clock, the client and the server.
func startEmbedded() (*redis.Client, func(), error) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting the embedded Redis: %w", err)
	}
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				m.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
	stop := func() {
		close(done)
		wg.Wait()
		_ = c.Close()
		m.Close()
	}
	return c, stop, nil
}

// envHelp documents the environment variables of the flags that kinds
// registers, for a command's --help.
func envHelp(kinds storeKinds) string {
	var vars, flags []string
	add := func(v, f string) { vars, flags = append(vars, v), append(flags, f) }
	if kinds&kindRedis != 0 {
		add(envRedisAddr, "--redis")
	}
	if kinds&kindCluster != 0 {
		add(envClusterAddrs, "--cluster")
	}
	if kinds&(kindRedis|kindCluster) != 0 && kinds&kindNames != 0 {
		add(envRedisPrefix, "--prefix")
	}
	if kinds&kindPostgres != 0 {
		add(envPostgresDSN, "--postgres")
	}
	if kinds&kindSQLite != 0 {
		add(envSQLiteFile, "--sqlite")
	}
	if kinds&(kindPostgres|kindSQLite) != 0 && kinds&kindNames != 0 {
		add(envTable, "--table")
	}
	s := "Environment: " + strings.Join(vars, ", ") + " stand in for " + strings.Join(flags, ", ") +
		"; a flag wins over its variable, and a store flag over the other stores' variables."
	if kinds&kindRedis != 0 {
		s += " " + envRedisURLOld + ", the former name of " + envRedisAddr + ", is still read (deprecated)."
	}
	return wrap(s, 80)
}

// wrap breaks s into lines of at most width characters, at spaces.
func wrap(s string, width int) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(s) {
		switch {
		case i == 0:
		case n+1+len(w) > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}
