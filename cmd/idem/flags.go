package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/storeopts"
	"github.com/idemgo/idem/sqlstore"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"
)

// The environment variables that stand in for the connection flags. A flag
// given on the command line wins over its variable.
const (
	envRedisURL     = "IDEM_REDIS_URL"
	envClusterAddrs = "IDEM_REDIS_CLUSTER_ADDRS"
	envPostgresDSN  = "IDEM_POSTGRES_DSN"
	envSQLiteFile   = "IDEM_SQLITE_FILE"
	envTable        = "IDEM_TABLE"
	envRedisPrefix  = "IDEM_REDIS_PREFIX"
)

// connectTimeout bounds the first contact with a store: an unreachable store
// is reported as one line and exit status 2, not a hang.
const connectTimeout = 5 * time.Second

// storeFlags are the connection flags shared by the commands. At most one
// of redis, cluster, postgres and sqlite may be set; none means the embedded
// Redis where a command allows it.
type storeFlags struct {
	redisURL, cluster, postgres, sqlite string
	table, prefix                       string
}

// register defines the connection flags on fs, with defaults from the
// environment.
func (f *storeFlags) register(fs *flag.FlagSet, getenv func(string) string, sql bool) {
	fs.StringVar(&f.redisURL, "redis", getenv(envRedisURL), "a Redis `URL`, redis://[user:pass@]host:port[/db] (env "+envRedisURL+")")
	fs.StringVar(&f.cluster, "cluster", getenv(envClusterAddrs), "comma-separated host:port `ADDRS` of a Redis Cluster's masters (env "+envClusterAddrs+")")
	fs.StringVar(&f.prefix, "prefix", or(getenv(envRedisPrefix), idem.DefaultPrefix), "the Redis key `prefix` of the store (env "+envRedisPrefix+")")
	if sql {
		fs.StringVar(&f.postgres, "postgres", getenv(envPostgresDSN), "a Postgres `DSN`, postgres://user@host:port/db (env "+envPostgresDSN+")")
		fs.StringVar(&f.sqlite, "sqlite", getenv(envSQLiteFile), "a SQLite database `FILE` (env "+envSQLiteFile+")")
		fs.StringVar(&f.table, "table", or(getenv(envTable), sqlstore.DefaultTable), "the SQL `table` of the store (env "+envTable+")")
	}
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
	// Redis whose maxmemory-policy may evict keys; NewRedisStore refuses
	// such a Redis to stores that record work.
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
	ro := storeopts.Redis(o)
	ro.Prefix = b.prefix
	ro.AllowEviction = b.allowEviction
	return idem.NewRedisStore(b.redis, ro)
}

func (b *backend) sqlStore(o idem.Options) (*sqlstore.Store, error) {
	so := storeopts.SQL(o, b.dialect)
	so.Table = b.table
	return sqlstore.New(b.db, so)
}

// errNoStore is returned by open when no store was named and the command has
// no embedded default.
var errNoStore = errors.New("no store given: use --redis, --cluster, --postgres or --sqlite (or their environment variables)")

// open connects to the store the flags name, or to an embedded Redis when
// none is named and embedded is true. It checks that the store answers.
// sqliteMustExist refuses a SQLite file that does not exist, so that an
// operator's typo does not silently create an empty database.
func (f *storeFlags) open(ctx context.Context, embedded, sqliteMustExist bool) (*backend, error) {
	n := 0
	for _, v := range []string{f.redisURL, f.cluster, f.postgres, f.sqlite} {
		if v != "" {
			n++
		}
	}
	if n > 1 {
		return nil, errors.New("give at most one of --redis, --cluster, --postgres and --sqlite")
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	b := &backend{prefix: f.prefix, table: f.table}
	switch {
	case f.redisURL != "":
		o, err := redis.ParseURL(f.redisURL)
		if err != nil {
			return nil, fmt.Errorf("--redis: %w", err)
		}
		c := redis.NewClient(o)
		b.redis, b.desc = c, "Redis at "+o.Addr
		b.closers = append(b.closers, func() { _ = c.Close() })
	case f.cluster != "":
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(f.cluster, ",")})
		b.redis, b.desc = c, "Redis Cluster at "+f.cluster
		b.closers = append(b.closers, func() { _ = c.Close() })
	case f.postgres != "":
		db, err := sql.Open("pgx", f.postgres)
		if err != nil {
			return nil, fmt.Errorf("--postgres: %w", err)
		}
		b.db, b.dialect, b.desc = db, sqlstore.Postgres, "Postgres"
		b.closers = append(b.closers, func() { _ = db.Close() })
	case f.sqlite != "":
		if sqliteMustExist {
			if _, err := os.Stat(f.sqlite); err != nil {
				return nil, fmt.Errorf("--sqlite: %w", err)
			}
		}
		// WAL is what sqlstore.Store requires; it persists in the file.
		db, err := sql.Open("sqlite", "file:"+f.sqlite+"?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
		if err != nil {
			return nil, fmt.Errorf("--sqlite: %w", err)
		}
		b.db, b.dialect, b.desc = db, sqlstore.SQLite, "SQLite file "+f.sqlite
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

// envHelp documents the environment variables, for every command's --help.
const envHelp = `Environment: ` + envRedisURL + `, ` + envClusterAddrs + `, ` + envPostgresDSN + `,
` + envSQLiteFile + `, ` + envTable + ` and ` + envRedisPrefix + ` stand in for --redis, --cluster,
--postgres, --sqlite, --table and --prefix; a flag wins over its variable.`
