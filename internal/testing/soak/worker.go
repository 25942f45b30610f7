package soak

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/sqlstore"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/redis/go-redis/v9"
)

// WorkerEnv is the environment variable that turns a re-executed test binary
// into a worker; its value is the worker's configuration as JSON.
const WorkerEnv = "IDEM_SOAK_WORKER"

// A worker reads deliveries on stdin and writes its events on this file
// descriptor (exec.Cmd.ExtraFiles[0]); stdout belongs to the test binary.
const eventsFD = 3

// sqlConns bounds a worker's Postgres connections, hence its concurrent Runs.
const sqlConns = 6

// maxBatch bounds the deliveries one consumer.Batch call handles.
const maxBatch = 16

// workerConfig is what the broker tells a worker process.
type workerConfig struct {
	Mode        Mode
	Name        string // idem.Options.Worker, and the ledger's writer column
	Batch       bool   // consumer.Batch rather than consumer.Idempotent (Redis mode)
	RedisAddr   string
	Prefix      string // RedisStore prefix
	LedgerKey   string // Redis list the effects are appended to
	PostgresDSN string
	Table       string // sqlstore.Store table
	LedgerTable string
	LeaseTTL    time.Duration
	Retention   time.Duration
	Prefetch    int
	// Tail bounds a random pause after the effect, before the handler
	// returns: the rest of a handler's work, which widens the window a kill
	// can fall into between the effect and the confirmation.
	Tail time.Duration
}

// IsWorker reports whether this process was started as a worker.
func IsWorker() bool { return os.Getenv(WorkerEnv) != "" }

// RunWorker runs the worker this process was started as (see IsWorker) until
// stdin closes and every delivery is settled, and returns the process's exit
// code. A TestMain calls it instead of m.Run.
func RunWorker() int {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(WorkerEnv)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "soak worker: bad %s: %v\n", WorkerEnv, err)
		return 2
	}
	w := &worker{cfg: cfg, out: os.NewFile(eventsFD, "soak-events")}
	if err := w.run(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "soak worker %s: %v\n", cfg.Name, err)
		return 1
	}
	return 0
}

// delivery is one message as a worker received it.
type delivery struct {
	tag, id string
	// Set by the handler when it did the work; read after the wrapper
	// returned.
	ran   bool
	token int64
}

type worker struct {
	cfg workerConfig
	mu  sync.Mutex // one event line per write
	out *os.File
}

// emit writes one event line with a single write(2): once it returns, the
// line is in the pipe and reaches the broker even if this process is killed
// the next instant.
func (w *worker) emit(format string, args ...any) {
	line := fmt.Sprintf(format, args...) + "\n"
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.out.WriteString(line); err != nil {
		// The broker is gone; nobody is left to settle deliveries with.
		fmt.Fprintf(os.Stderr, "soak worker %s: events: %v\n", w.cfg.Name, err)
		os.Exit(3)
	}
}

func (w *worker) tail() {
	if w.cfg.Tail > 0 {
		time.Sleep(rand.N(w.cfg.Tail))
	}
}

func (w *worker) run(ctx context.Context) error {
	var handle func(ctx context.Context, ds []*delivery)
	var closeStore func()
	var err error
	switch w.cfg.Mode {
	case Redis:
		handle, closeStore, err = w.redis()
	case SQL:
		handle, closeStore, err = w.sql()
	default:
		err = fmt.Errorf("unknown mode %q", w.cfg.Mode)
	}
	if err != nil {
		return err
	}
	defer closeStore()

	ds := make(chan *delivery, max(w.cfg.Prefetch, 1))
	readErr := make(chan error, 1)
	go func() {
		defer close(ds)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 || f[0] != "D" {
				readErr <- fmt.Errorf("bad delivery line %q", sc.Text())
				return
			}
			ds <- &delivery{tag: f[1], id: f[2]}
		}
		readErr <- sc.Err()
	}()

	var wg sync.WaitGroup
	if w.cfg.Batch {
		// Two batch loops, so that a kill often falls while one batch runs
		// its handlers and the other confirms.
		for range 2 {
			wg.Go(func() {
				for d := range ds {
					batch := gather(d, ds)
					handle(ctx, batch)
				}
			})
		}
	} else {
		// The broker's prefetch bounds the deliveries in flight, hence the
		// goroutines.
		for d := range ds {
			wg.Go(func() { handle(ctx, []*delivery{d}) })
		}
	}
	wg.Wait()
	return <-readErr
}

// gather returns first and the deliveries that arrive within a moment
// after it, up to maxBatch.
func gather(first *delivery, ds <-chan *delivery) []*delivery {
	batch := []*delivery{first}
	linger := time.NewTimer(2 * time.Millisecond)
	defer linger.Stop()
	for len(batch) < maxBatch {
		select {
		case d, ok := <-ds:
			if !ok {
				return batch
			}
			batch = append(batch, d)
		case <-linger.C:
			return batch
		}
	}
	return batch
}

// settle tells the broker what the wrapper's error means for the delivery,
// by the rules in the consumer package's documentation.
func (w *worker) settle(d *delivery, err error) {
	switch {
	case err == nil:
		if d.ran {
			w.emit("C %s %d", d.id, d.token)
		}
		w.emit("A %s", d.tag)
	case errors.Is(err, consumer.ErrNotRecorded):
		// Done but not recorded: ack, and say so; a later duplicate may do it again.
		w.emit("K not_recorded %s %d", idem.KeyHash(d.id), d.token)
		w.emit("A %s", d.tag)
	case errors.Is(err, idem.ErrInProgress):
		w.emit("N %s busy", d.tag)
	default:
		w.emit("N %s error", d.tag)
		fmt.Fprintf(os.Stderr, "soak worker %s: %s: %v\n", w.cfg.Name, d.id, err)
	}
}

// redis is lease mode: consumer.Idempotent or consumer.Batch over a
// RedisStore, the effect an RPUSH onto a Redis list.
func (w *worker) redis() (func(context.Context, []*delivery), func(), error) {
	c := redis.NewClient(&redis.Options{Addr: w.cfg.RedisAddr})
	store, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: w.cfg.Prefix,
		Worker: w.cfg.Name, LeaseTTL: w.cfg.LeaseTTL, Retention: w.cfg.Retention})
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	opts := consumer.Options[*delivery]{Hook: func(_ context.Context, e consumer.Event) {
		switch e.Kind {
		case consumer.LeaseLost, consumer.LateConfirm, consumer.ConfirmFailed, consumer.AlreadyConfirmed:
			w.emit("K %s %s %d", e.Kind, e.KeyHash, e.Token)
		}
	}}
	key := func(d *delivery) string { return d.id }
	h := func(ctx context.Context, d *delivery) error {
		l, ok := idem.LeaseFrom(ctx)
		if !ok {
			return errors.New("no lease in the handler's context")
		}
		if err := c.RPush(ctx, w.cfg.LedgerKey, fmt.Sprintf("%s %d %s", d.id, l.Token, w.cfg.Name)).Err(); err != nil {
			return err
		}
		d.ran, d.token = true, l.Token
		w.emit("E %s %d", d.id, l.Token)
		w.tail()
		return nil
	}
	one := consumer.Idempotent(store, key, h, opts)
	batch := consumer.Batch(store, key, h, opts)
	handle := func(ctx context.Context, ds []*delivery) {
		if w.cfg.Batch {
			for i, err := range batch(ctx, ds) {
				w.settle(ds[i], err)
			}
			return
		}
		for _, d := range ds {
			w.settle(d, one(ctx, d))
		}
	}
	return handle, func() { _ = c.Close() }, nil
}

// sql is transactional mode: sqlstore.Store.Run, the effect an INSERT in the
// same transaction as the record.
func (w *worker) sql() (func(context.Context, []*delivery), func(), error) {
	db, err := sql.Open("pgx", w.cfg.PostgresDSN)
	if err != nil {
		return nil, nil, err
	}
	// A few connections per worker: the Postgres of `make test` serves every
	// other test too, and keeps at most 100.
	db.SetMaxOpenConns(sqlConns)
	store, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: w.cfg.Table,
		Worker: w.cfg.Name, LeaseTTL: w.cfg.LeaseTTL, Retention: w.cfg.Retention})
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	insert := "INSERT INTO " + w.cfg.LedgerTable + " (id, worker) VALUES ($1, $2)"
	handle := func(ctx context.Context, ds []*delivery) {
		for _, d := range ds {
			_, replayed, err := store.Run(ctx, d.id, nil, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				if _, err := tx.ExecContext(ctx, insert, d.id, w.cfg.Name); err != nil {
					return nil, err
				}
				w.emit("E %s 0", d.id)
				w.tail()
				return nil, nil
			})
			d.ran = err == nil && !replayed
			w.settle(d, err)
		}
	}
	return handle, func() { _ = db.Close() }, nil
}
