package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/internal/testing/crashstore"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// The crash points (issue 34): a holder of a two-step job (charge, then
// ship, with a checkpoint after the charge) dies at each point, and the
// next holder must be told what it needs to finish the job without
// repeating a step: the take-over, the attempt taken over (its owner and
// token) and the last checkpoint. Reconciling with the downstream ledger,
// every step then takes effect exactly once.
//
// A holder dies as a process does: its store (crashstore) answers nothing
// from then on, so its lease is neither renewed nor confirmed nor
// forgotten, and runs out.

// crashPoint is where the first holder dies.
type crashPoint int

const (
	beforeEffect         crashPoint = iota // nothing done
	effectNoCheckpoint                     // charged, the checkpoint not written
	afterCheckpoint                        // charged and checkpointed, not shipped
	effectsBeforeConfirm                   // charged, checkpointed and shipped; not confirmed
	numCrashPoints
)

var crashPointNames = [...]string{"before the effect", "between effect and checkpoint", "after the checkpoint", "between effect and confirm"}

// jobLedger is the downstream system: the steps that took effect, by key,
// which a take-over asks before redoing one.
type jobLedger struct {
	mu      sync.Mutex
	charged map[string]int
	shipped map[string]int
}

func newJobLedger() *jobLedger {
	return &jobLedger{charged: map[string]int{}, shipped: map[string]int{}}
}

func (l *jobLedger) charge(k string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.charged[k]++
}

func (l *jobLedger) ship(k string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.shipped[k]++
}

func (l *jobLedger) state(k string) (charged, shipped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.charged[k], l.shipped[k]
}

// job is the two-step work, run under a lease whose context carries the
// store (idem.Checkpoint) and, after a crash, the take-over. It resumes
// after the checkpoint, and asks the ledger about a step done but not
// checkpointed. die, when set, is called where the holder dies.
func (l *jobLedger) job(ctx context.Context, key string, at crashPoint, die func()) {
	resume := ""
	if t, ok := idem.TakeOverFrom(ctx); ok {
		resume = string(t.Checkpoint)
	}
	if die != nil && at == beforeEffect {
		die()
	}
	if resume != "charged" {
		// No checkpoint: the charge may have landed all the same (the
		// holder died between it and its checkpoint). Ask.
		if c, _ := l.state(key); c == 0 {
			l.charge(key)
		}
		if die != nil && at == effectNoCheckpoint {
			die()
		}
		_ = idem.Checkpoint(ctx, []byte("charged"))
	}
	if die != nil && at == afterCheckpoint {
		die()
	}
	if _, s := l.state(key); s == 0 {
		l.ship(key)
	}
	if die != nil && at == effectsBeforeConfirm {
		die()
	}
}

// crashBackends are the real services the crash points run on (and the
// memory store, the reference). Each open returns a store of worker w over
// the backend's records.
func crashBackends(t *testing.T) map[string]func(w string) idem.Store {
	const lease = idem.MinLeaseTTL
	o := func(w string) idem.Options {
		return idem.Options{Worker: w, LeaseTTL: lease, Retention: time.Minute}
	}
	mem := must(idem.NewMemoryStore(idem.Options{LeaseTTL: lease}))
	out := map[string]func(string) idem.Store{
		"memory": func(w string) idem.Store { return must(mem.Share(o(w))) },
	}
	out["redis"] = func() func(string) idem.Store {
		c := testenv.Redis(t)
		prefix := testenv.UniquePrefix()
		return func(w string) idem.Store {
			ro := idem.RedisOptionsFrom(o(w))
			ro.Prefix = prefix
			return must(idem.NewRedisStore(c, ro))
		}
	}()
	out["cluster"] = func() func(string) idem.Store {
		c := testenv.Cluster(t)
		prefix := testenv.UniquePrefix()
		return func(w string) idem.Store {
			ro := idem.RedisOptionsFrom(o(w))
			ro.Prefix = prefix
			return must(idem.NewRedisStore(c, ro))
		}
	}()
	// Confirmations as hash fields, on a server and a cluster that keep
	// them so: the consumer's confirms (no result) are fields, Do's keys.
	fields := func(c redis.UniversalClient) func(string) idem.Store {
		prefix := testenv.UniquePrefix()
		writeFormKey(t, c, prefix, 1)
		return func(w string) idem.Store {
			ro := idem.RedisOptionsFrom(o(w))
			ro.Prefix, ro.FieldHashes = prefix, 1
			return must(idem.NewRedisStore(c, ro))
		}
	}
	for _, srv := range testenv.Servers {
		if srv.FieldExpiry() {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr(t)})
			t.Cleanup(func() { _ = c.Close() })
			out[srv.Name+" fields"] = fields(c)
		}
	}
	for _, cs := range testenv.Clusters {
		if cs.FieldExpiry() {
			out["cluster "+cs.Name+" fields"] = fields(cs.Client(t))
		}
	}
	out["postgres"] = func() func(string) idem.Store {
		db := sqltest.Postgres(t)
		table := sqltest.UniqueTable()
		so := sqlstore.OptionsFrom(o("setup"), sqlstore.Postgres)
		so.Table = table
		sqltest.NewStore(t, db, so)
		return func(w string) idem.Store {
			so := sqlstore.OptionsFrom(o(w), sqlstore.Postgres)
			so.Table = table
			return must(sqlstore.New(db, so))
		}
	}()
	out["mysql"] = func() func(string) idem.Store {
		db := sqltest.MySQL(t)
		table := sqltest.UniqueTable()
		so := sqlstore.OptionsFrom(o("setup"), sqlstore.MySQL)
		so.Table = table
		sqltest.NewStore(t, db, so)
		return func(w string) idem.Store {
			so := sqlstore.OptionsFrom(o(w), sqlstore.MySQL)
			so.Table = table
			return must(sqlstore.New(db, so))
		}
	}()
	return out
}

// TestCrashPoints runs the crash points through Do (Reconcile asks the
// ledger, fn resumes after the checkpoint) and through the consumer
// wrapper (the handler reads the take-over from its context), on every
// backend.
func TestCrashPoints(t *testing.T) {
	for name, open := range crashBackends(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for at := range numCrashPoints {
				for _, door := range []string{"Do", "consumer"} {
					t.Run(fmt.Sprintf("%s/%s", crashPointNames[at], door), func(t *testing.T) {
						t.Parallel()
						crashAt(t, open, at, door)
					})
				}
			}
		})
	}
}

// crashAt runs one crash point through one front door: the first holder
// dies at at, the second finishes the job, a third call finds it done.
func crashAt(t *testing.T, open func(string) idem.Store, at crashPoint, door string) {
	ledger := newJobLedger()
	key := fmt.Sprintf("crash-%d-%s-%d", at, door, time.Now().UnixNano())
	first := &crashstore.Store{Store: open("first"), Unconfirmed: new(sync.Map)}
	die := func() {
		first.Dead.Store(true) // from now on the process makes no call
		runtime.Goexit()
	}
	var firstLease *idem.Lease
	run := func(s idem.Store, dieAt func(), seen *seenTakeOver) error {
		switch door {
		case "Do":
			opts := idem.DoOptions{Reconcile: func(ctx context.Context, tk *idem.TakeOver) (any, bool, error) {
				seen.set(tk)
				// The whole job landed (the holder died before its
				// confirm): record it without running it again.
				if c, s := ledger.state(key); c > 0 && s > 0 {
					return "done", true, nil
				}
				return nil, false, nil
			}}
			_, err := idem.Do(context.Background(), s, key, func(ctx context.Context) (string, error) {
				if l, ok := idem.LeaseFrom(ctx); ok && firstLease == nil {
					firstLease = l
				}
				ledger.job(ctx, key, at, dieAt)
				return "done", nil
			}, opts)
			return err
		default:
			h := consumer.Idempotent(s, func(k string) string { return k }, func(ctx context.Context, k string) error {
				if l, ok := idem.LeaseFrom(ctx); ok && firstLease == nil {
					firstLease = l
				}
				if tk, ok := idem.TakeOverFrom(ctx); ok {
					seen.set(tk)
				}
				ledger.job(ctx, k, at, dieAt)
				return nil
			})
			return h(context.Background(), key)
		}
	}
	// The first holder, on a goroutine of its own: it dies there.
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = run(first, die, &seenTakeOver{})
		t.Errorf("the first holder returned; want it dead at %s", crashPointNames[at])
	}()
	<-done
	if firstLease == nil {
		t.Fatal("the first holder ran without a lease in its context")
	}
	// The next holder: it claims once the dead holder's lease ran out.
	time.Sleep(firstLease.TTL + 100*time.Millisecond)
	next := open("next")
	var seen seenTakeOver
	if err := run(next, nil, &seen); err != nil {
		t.Fatalf("the next holder: %v; want the job finished", err)
	}
	tk := seen.get()
	if tk == nil {
		t.Fatalf("the next holder was not told of the take-over after a crash %s", crashPointNames[at])
	}
	if tk.Prior.Owner != "first" || tk.Prior.Token != firstLease.Token || tk.TakeOvers != 1 {
		t.Errorf("take-over = prior %q token %d, %d take-overs; want the dead holder's (%q, token %d), 1",
			tk.Prior.Owner, tk.Prior.Token, tk.TakeOvers, "first", firstLease.Token)
	}
	wantCP := ""
	if at >= afterCheckpoint {
		wantCP = "charged"
	}
	if string(tk.Checkpoint) != wantCP {
		t.Errorf("take-over checkpoint = %q; want %q after a crash %s", tk.Checkpoint, wantCP, crashPointNames[at])
	}
	if c, s := ledger.state(key); c != 1 || s != 1 {
		t.Errorf("after a crash %s: charged %d, shipped %d; want each once", crashPointNames[at], c, s)
	}
	// Done and recorded: a later call is a duplicate.
	c, err := next.Claim(context.Background(), key, nil)
	if err != nil || c.Outcome != idem.Duplicate {
		t.Errorf("Claim after the job = %v, %v; want Duplicate", c.Outcome, err)
	}
	if errors.Is(err, idem.ErrQuarantined) {
		t.Errorf("one crash quarantined the key")
	}
}

// seenTakeOver keeps the take-over a holder was told of.
type seenTakeOver struct {
	mu sync.Mutex
	tk *idem.TakeOver
}

func (s *seenTakeOver) set(t *idem.TakeOver) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tk == nil {
		s.tk = t
	}
}

func (s *seenTakeOver) get() *idem.TakeOver {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tk
}
