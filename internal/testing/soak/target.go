package soak

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/sqlstore"
	"github.com/redis/go-redis/v9"
)

// target is where a run keeps its records and its ledger.
type target interface {
	// worker returns the configuration of a worker named name, store and
	// ledger fields filled in.
	worker(name string) workerConfig
	ledger(ctx context.Context) ([]Row, error)
	lookup(ctx context.Context, id string) (*idem.Record, error)
	close()
}

type redisTarget struct {
	addr, prefix, ledgerKey string
	c                       *redis.Client
	store                   *idem.RedisStore
}

func newRedisTarget(ctx context.Context, addr, run string) (*redisTarget, error) {
	t := &redisTarget{addr: addr, prefix: "idemsoak:" + run + ":", ledgerKey: "idemsoak-ledger:" + run,
		c: redis.NewClient(&redis.Options{Addr: addr})}
	if err := t.c.Ping(ctx).Err(); err != nil {
		_ = t.c.Close()
		return nil, fmt.Errorf("soak: Redis at %s: %w", addr, err)
	}
	var err error
	if t.store, err = idem.NewRedisStore(t.c, idem.RedisOptions{Prefix: t.prefix, Worker: "inspector"}); err != nil {
		_ = t.c.Close()
		return nil, err
	}
	return t, nil
}

func (t *redisTarget) worker(name string) workerConfig {
	return workerConfig{Mode: Redis, Name: name, RedisAddr: t.addr, Prefix: t.prefix, LedgerKey: t.ledgerKey}
}

func (t *redisTarget) ledger(ctx context.Context) ([]Row, error) {
	lines, err := t.c.LRange(ctx, t.ledgerKey, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	rows := make([]Row, len(lines))
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) != 3 {
			return nil, fmt.Errorf("bad ledger entry %q", l)
		}
		tok, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad ledger entry %q", l)
		}
		rows[i] = Row{ID: f[0], Token: tok, Worker: f[2]}
	}
	return rows, nil
}

func (t *redisTarget) lookup(ctx context.Context, id string) (*idem.Record, error) {
	return t.store.Lookup(ctx, id)
}

// close removes the run's keys: the records, and the ledger.
func (t *redisTarget) close() {
	ctx := context.Background()
	iter := t.c.Scan(ctx, 0, t.prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == 1000 {
			_ = t.c.Unlink(ctx, keys...).Err()
			keys = keys[:0]
		}
	}
	keys = append(keys, t.ledgerKey)
	_ = t.c.Unlink(ctx, keys...).Err()
	_ = t.c.Close()
}

type sqlTarget struct {
	dsn, table, ledgerTable string
	db                      *sql.DB
	store                   *sqlstore.Store
}

func newSQLTarget(ctx context.Context, dsn, run string) (*sqlTarget, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	t := &sqlTarget{dsn: dsn, table: "soak_keys_" + run, ledgerTable: "soak_ledger_" + run, db: db}
	if t.store, err = sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: t.table,
		Worker: "inspector"}); err != nil {
		_ = db.Close()
		return nil, err
	}
	// No unique constraint on id: a message's work done twice must show as
	// two rows, not be hidden by a constraint violation.
	ddl := "CREATE TABLE " + t.ledgerTable + " (seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL, worker TEXT NOT NULL)"
	if err := errors.Join(t.store.CreateSchema(ctx), execSQL(ctx, db, ddl)); err != nil {
		t.close()
		return nil, fmt.Errorf("soak: Postgres: %w", err)
	}
	return t, nil
}

func execSQL(ctx context.Context, db *sql.DB, q string) error {
	_, err := db.ExecContext(ctx, q)
	return err
}

func (t *sqlTarget) worker(name string) workerConfig {
	return workerConfig{Mode: SQL, Name: name, PostgresDSN: t.dsn, Table: t.table, LedgerTable: t.ledgerTable}
}

func (t *sqlTarget) ledger(ctx context.Context) ([]Row, error) {
	rs, err := t.db.QueryContext(ctx, "SELECT id, worker FROM "+t.ledgerTable)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var rows []Row
	for rs.Next() {
		var r Row
		if err := rs.Scan(&r.ID, &r.Worker); err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, rs.Err()
}

func (t *sqlTarget) lookup(ctx context.Context, id string) (*idem.Record, error) {
	return t.store.Lookup(ctx, id)
}

// close drops the run's tables.
func (t *sqlTarget) close() {
	ctx := context.Background()
	_ = execSQL(ctx, t.db, "DROP TABLE IF EXISTS "+t.ledgerTable)
	_ = execSQL(ctx, t.db, "DROP TABLE IF EXISTS "+t.table)
	_ = t.db.Close()
}

// lookupAll returns every id's record (nil when there is none), from 8
// concurrent callers.
func lookupAll(ctx context.Context, t target, ids []string) (map[string]*idem.Record, error) {
	recs := make(map[string]*idem.Record, len(ids))
	var mu sync.Mutex
	var first error
	next := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for id := range next {
				rec, err := t.lookup(ctx, id)
				mu.Lock()
				switch {
				case err == nil:
					recs[id] = rec
				case errors.Is(err, idem.ErrNotFound):
				case first == nil:
					first = err
				}
				mu.Unlock()
			}
		})
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	return recs, first
}
