package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/sqlstore"
)

// connectTimeout bounds the first contact with a store: an unreachable store
// is reported as one line and exit status 2, not a hang.
const connectTimeout = 5 * time.Second

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
var errNoStore = errors.New("no store given: use --redis, --cluster, --postgres, --mysql or --sqlite (or their environment variables)")

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
	case f.kind == "mysql":
		db, err := sql.Open(mysqlDriver, f.mysql)
		if err != nil {
			return nil, fmt.Errorf("--mysql: %w", err)
		}
		b.db, b.dialect, b.desc = db, sqlstore.MySQL, "MySQL"
		b.closers = append(b.closers, func() { _ = db.Close() })
	case f.kind == "sqlite":
		if sqliteMustExist {
			if _, err := os.Stat(f.sqlitePath); err != nil {
				var pe *fs.PathError
				if errors.As(err, &pe) {
					err = pe.Err
				}
				return nil, fmt.Errorf("--sqlite %q: %w (inspect, prune and console open an existing database)", f.sqlitePath, err)
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
