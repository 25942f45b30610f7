package idem_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/retry"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
	"github.com/idemgo/idem/storetest"
)

// doBackends opens, for one test, a backend of each kind on records of its
// own (a fresh miniredis, prefix, table or file): its Open returns stores
// that share them, as processes sharing one Redis or one table do.
var doBackends = []struct {
	name string
	open func(t *testing.T) storetest.Backend
}{
	{"memory", func(*testing.T) storetest.Backend {
		m := memStore(idem.Options{})
		return storetest.Backend{Open: func(o idem.Options) (idem.Store, error) { return m.Share(o) }}
	}},
	{"miniredis", func(t *testing.T) storetest.Backend {
		return miniredisBackend(t, idem.RedisOptions{Prefix: "idem:"})
	}},
	{"redis", func(t *testing.T) storetest.Backend {
		return redisBackend(testenv.Redis(t), idem.RedisOptions{Prefix: testenv.UniquePrefix()}, nil)
	}},
	{"cluster", func(t *testing.T) storetest.Backend {
		return redisBackend(testenv.Cluster(t), idem.RedisOptions{Prefix: testenv.UniquePrefix()}, nil)
	}},
	{"sqlite", func(t *testing.T) storetest.Backend {
		// Each store a handle of its own on the file, as separate
		// processes would have.
		path := filepath.Join(t.TempDir(), "idem.db")
		table := sqltest.UniqueTable()
		sqltest.NewStore(t, sqltest.OpenSQLite(t, path), sqlstore.Options{Dialect: sqlstore.SQLite, Table: table})
		return storetest.Backend{Open: func(o idem.Options) (idem.Store, error) {
			so := sqlstore.OptionsFrom(o, sqlstore.SQLite)
			so.Table = table
			return sqlstore.New(sqltest.OpenSQLite(t, path), so)
		}}
	}},
	{"postgres", func(t *testing.T) storetest.Backend {
		db := sqltest.PostgresPool(t, 10)
		table := sqltest.UniqueTable()
		sqltest.NewStore(t, db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: table})
		return storetest.Backend{Open: func(o idem.Options) (idem.Store, error) {
			so := sqlstore.OptionsFrom(o, sqlstore.Postgres)
			so.Table = table
			return sqlstore.New(db, so)
		}}
	}},
	{"mysql", func(t *testing.T) storetest.Backend {
		db := sqltest.MySQLPool(t, 10)
		table := sqltest.UniqueTable()
		sqltest.NewStore(t, db, sqlstore.Options{Dialect: sqlstore.MySQL, Table: table})
		return storetest.Backend{Open: func(o idem.Options) (idem.Store, error) {
			so := sqlstore.OptionsFrom(o, sqlstore.MySQL)
			so.Table = table
			return sqlstore.New(db, so)
		}}
	}},
}

// onEveryBackend runs f, in parallel, on a backend of each kind, with
// open returning a store of worker w on it.
func onEveryBackend(t *testing.T, f func(t *testing.T, open func(w int, o idem.Options) idem.Store)) {
	onEveryBackendClock(t, func(t *testing.T, open func(int, idem.Options) idem.Store, _ func(time.Duration)) { f(t, open) })
}

// onEveryBackendClock is onEveryBackend with wait, which lets d pass on
// the backend's clock: miniredis's is moved, others' waited for.
func onEveryBackendClock(t *testing.T, f func(t *testing.T, open func(w int, o idem.Options) idem.Store, wait func(d time.Duration))) {
	for _, b := range doBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			be := b.open(t)
			wait := time.Sleep
			if be.Advance != nil {
				wait = be.Advance
			}
			f(t, func(w int, o idem.Options) idem.Store {
				t.Helper()
				o.Worker = fmt.Sprintf("worker-%d", w)
				o.LeaseTTL = cmpOr(o.LeaseTTL, 2*time.Second)
				o.Retention = time.Minute
				s, err := be.Open(o)
				if err != nil {
					t.Fatalf("Open(%+v) = %v; want a store", o, err)
				}
				return s
			}, wait)
		})
	}
}

func cmpOr(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

// doKey is a key no other test uses.
func doKey(name string) string { return "do-" + name + "-" + uuid.NewString() }

type receipt struct {
	ID    string
	Token int64
}

// Fifty callers of one key, on five workers, all at once: the function runs
// once per key, and every caller gets its result, the ones that found it
// in flight by waiting for it.
func TestDoRunsOncePerKeyAmongRacers(t *testing.T) {
	const racers, keys, workers = 50, 3, 5
	onEveryBackend(t, func(t *testing.T, open func(int, idem.Options) idem.Store) {
		stores := make([]idem.Store, workers)
		for w := range stores {
			stores[w] = open(w, idem.Options{})
		}
		for k := range keys {
			key := doKey("race")
			var runs atomic.Int64
			fn := func(ctx context.Context) (receipt, error) {
				n := runs.Add(1)
				l, ok := idem.LeaseFrom(ctx)
				if !ok {
					return receipt{}, errors.New("no lease in fn's context")
				}
				time.Sleep(20 * time.Millisecond) // long enough for the others to find it in flight
				return receipt{ID: fmt.Sprintf("run-%d", n), Token: l.Token}, nil
			}
			got := make([]receipt, racers)
			errs := make([]error, racers)
			var start, wg sync.WaitGroup
			start.Add(1)
			for i := range racers {
				wg.Go(func() {
					start.Wait()
					got[i], errs[i] = idem.Do(t.Context(), stores[i%workers], key, fn)
				})
			}
			start.Done()
			wg.Wait()
			t.Logf("key %d: %d runs among %d racers", k, runs.Load(), racers)
			if n := runs.Load(); n != 1 {
				t.Errorf("key %d: fn ran %d times among %d racers; want 1", k, n, racers)
			}
			for i := range racers {
				if errs[i] != nil || got[i] != got[0] || got[i].Token == 0 {
					t.Errorf("key %d racer %d: Do = %+v, %v; want %+v, nil like racer 0, with the lease's token", k, i, got[i], errs[i], got[0])
				}
			}
		}
	})
}

var errDeclined = errors.New("card declined")

// An error marked Permanent is recorded and replayed: its message, its
// mark, and the sentinel listed in DoOptions.Errors survive; the function
// does not run again. An unmarked error forgets the claim: the next call
// runs the function.
func TestDoReplaysPermanentErrorsAndRetriesOthers(t *testing.T) {
	onEveryBackend(t, func(t *testing.T, open func(int, idem.Options) idem.Store) {
		s := open(0, idem.Options{})
		ctx := t.Context()
		o := idem.DoOptions{Errors: []error{errors.New("other"), errDeclined}}

		key := doKey("permanent")
		runs := 0
		declined := func(context.Context) (string, error) {
			runs++
			return "", fmt.Errorf("order 7: %w", idem.Permanent(errDeclined))
		}
		_, first := idem.Do(ctx, s, key, declined, o)
		var pe *idem.PermanentError
		if !errors.Is(first, errDeclined) || !errors.As(first, &pe) || pe.Replayed {
			t.Fatalf("Do(%q) = %v; want fn's error, matching errDeclined, a PermanentError not replayed", key, first)
		}
		for i, opts := range [][]idem.DoOptions{{o}, nil} {
			v, err := idem.Do(ctx, s, key, declined, opts...)
			pe = nil
			switch {
			case runs != 1:
				t.Errorf("replay %d: fn ran %d times; want 1 (a permanent error is the key's answer)", i, runs)
			case err == nil || err.Error() != first.Error() || v != "":
				t.Errorf("replay %d: Do(%q) = %q, %v; want \"\", the first call's error %q", i, key, v, err, first)
			case !errors.As(err, &pe) || !pe.Replayed:
				t.Errorf("replay %d: Do(%q) = %v; want a replayed PermanentError", i, key, err)
			case (len(opts) == 1) != errors.Is(err, errDeclined):
				t.Errorf("replay %d with %d DoOptions: errors.Is(%v, errDeclined) = %v; want it only when Errors lists errDeclined",
					i, len(opts), err, errors.Is(err, errDeclined))
			}
		}

		key = doKey("transient")
		runs = 0
		flaky := func(context.Context) (string, error) {
			runs++
			if runs == 1 {
				return "", errors.New("connection reset")
			}
			return fmt.Sprintf("done by run %d", runs), nil
		}
		if _, err := idem.Do(ctx, s, key, flaky); err == nil || err.Error() != "connection reset" {
			t.Fatalf("Do(%q) = %v; want fn's own error", key, err)
		}
		if _, err := s.Lookup(ctx, key); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Lookup(%q) after fn's error = %v; want ErrNotFound (the claim forgotten, not left to run out)", key, err)
		}
		for range 2 {
			if v, err := idem.Do(ctx, s, key, flaky); err != nil || v != "done by run 2" {
				t.Errorf("Do(%q) after an error = %q, %v; want \"done by run 2\" (run again, then replayed)", key, v, err)
			}
		}
		if runs != 2 {
			t.Errorf("fn ran %d times; want 2: the failed run, then one run replayed", runs)
		}
	})
}

// MaxHold ends the function's context with a cause naming the cap, and
// the lease is no longer renewed after it, even while fn goes on.
func TestDoMaxHoldEndsTheContext(t *testing.T) {
	onEveryBackend(t, func(t *testing.T, open func(int, idem.Options) idem.Store) {
		// A lease and a cap that a busy machine's stalls do not undo.
		const ttl, hold = time.Second, 600 * time.Millisecond
		s := &renewLog{Store: open(0, idem.Options{LeaseTTL: ttl})}
		key := doKey("hold")
		var capped time.Time
		var cause error
		start := time.Now()
		_, err := idem.Do(t.Context(), s, key, func(ctx context.Context) (int, error) {
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
			capped, cause = time.Now(), context.Cause(ctx)
			time.Sleep(ttl * 2 / 3) // a fn that does not stop at once
			return 0, cause
		}, idem.DoOptions{MaxHold: hold})
		if !errors.Is(cause, idem.ErrMaxHold) || !strings.Contains(cause.Error(), hold.String()) {
			t.Errorf("context.Cause of fn's context = %v; want one matching ErrMaxHold that names %v", cause, hold)
		}
		// Under 5s: the fallback above did not end it; the cause proves
		// the cap did.
		if took := capped.Sub(start); took < hold || took > hold+3*time.Second {
			t.Errorf("fn's context ended after %v; want about MaxHold, %v", took, hold)
		}
		if !errors.Is(err, idem.ErrMaxHold) {
			t.Errorf("Do = %v; want fn's error, matching ErrMaxHold", err)
		}
		if n := s.renewsAfter(capped); n != 0 {
			t.Errorf("%d renewals after MaxHold; want none", n)
		}
		if s.renewsAfter(start) == 0 {
			t.Errorf("no renewal within MaxHold (%v, lease %v); want the lease kept alive until the cap", hold, ttl)
		}
		// fn failed: the claim is forgotten, and the next call runs it.
		if v, err := idem.Do(t.Context(), s, key, func(context.Context) (int, error) { return 7, nil }); v != 7 || err != nil {
			t.Errorf("Do(%q) after the capped run = %d, %v; want 7, nil", key, v, err)
		}
	})
}

// renewLog notes when each Renew that succeeded was sent.
type renewLog struct {
	idem.Store
	mu     sync.Mutex
	renews []time.Time
}

func (s *renewLog) Renew(ctx context.Context, l *idem.Lease) error {
	sent := time.Now()
	err := s.Store.Renew(ctx, l)
	if err == nil {
		s.mu.Lock()
		s.renews = append(s.renews, sent)
		s.mu.Unlock()
	}
	return err
}

func (s *renewLog) renewsAfter(t time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.renews {
		if r.After(t) {
			n++
		}
	}
	return n
}

// A panic in fn forgets the claim and goes on up the caller's stack; the
// next call runs fn.
func TestDoPanicForgets(t *testing.T) {
	onEveryBackend(t, func(t *testing.T, open func(int, idem.Options) idem.Store) {
		s := open(0, idem.Options{})
		key := doKey("panic")
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Errorf("recover() = %v; want fn's panic, \"boom\"", p)
				}
			}()
			_, _ = idem.Do(t.Context(), s, key, func(context.Context) (int, error) { panic("boom") })
			t.Errorf("Do returned after fn panicked; want the panic re-raised")
		}()
		if _, err := s.Lookup(t.Context(), key); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Lookup(%q) after the panic = %v; want ErrNotFound (the claim forgotten)", key, err)
		}
		if v, err := idem.Do(t.Context(), s, key, func(context.Context) (int, error) { return 2, nil }); v != 2 || err != nil {
			t.Errorf("Do(%q) after the panic = %d, %v; want 2, nil", key, v, err)
		}
	})
}

// A call that finds the key in flight waits for the holder's result; one
// whose Wait (or context) ends first says the key is in progress.
func TestDoWaitsForTheKeyInFlight(t *testing.T) {
	onEveryBackend(t, func(t *testing.T, open func(int, idem.Options) idem.Store) {
		holder, waiter := open(0, idem.Options{}), &recordingStore{Store: open(1, idem.Options{})}
		key := doKey("wait")
		release, started := make(chan struct{}), make(chan struct{})
		var runs atomic.Int64
		fn := func(context.Context) ([]byte, error) {
			if runs.Add(1) == 1 {
				close(started)
				<-release
			}
			return []byte("holder's result"), nil
		}
		first := make(chan error, 1)
		go func() {
			_, err := idem.Do(t.Context(), holder, key, fn)
			first <- err
		}()
		<-started

		short := time.Now()
		if v, err := idem.Do(t.Context(), waiter, key, fn, idem.DoOptions{Wait: 100 * time.Millisecond}); !errors.Is(err, idem.ErrInProgress) || v != nil {
			t.Errorf("Do(%q, Wait 100ms) while held = %q, %v; want ErrInProgress", key, v, err)
		} else if took := time.Since(short); took < 100*time.Millisecond || took > 2*time.Second {
			t.Errorf("Do(%q, Wait 100ms) answered after %v; want about 100ms", key, took)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := idem.Do(ctx, waiter, key, fn); err == nil || runs.Load() != 1 {
			t.Errorf("Do(%q) with a cancelled context = %v; want an error, fn not run", key, err)
		}

		got := make(chan error, 1)
		var v []byte
		calls := waiter.calls.Load()
		go func() {
			var err error
			v, err = idem.Do(t.Context(), waiter, key, fn)
			got <- err
		}()
		// Released once the waiter has polled: its Claim, then a Lookup.
		for deadline := time.Now().Add(10 * time.Second); waiter.calls.Load() < calls+2; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the waiter made %d calls in 10s; want a Claim and a Lookup", waiter.calls.Load()-calls)
			}
		}
		close(release)
		if err := <-first; err != nil {
			t.Fatalf("the holder's Do = %v; want nil", err)
		}
		if err := <-got; err != nil || string(v) != "holder's result" || runs.Load() != 1 {
			t.Errorf("the waiter's Do = %q, %v after %d runs; want the holder's result, from its one run", v, err, runs.Load())
		}
	})
}

// A key reused with another fingerprint is refused, in flight or done, and
// the function does not run.
func TestDoFingerprintMismatch(t *testing.T) {
	onEveryBackend(t, func(t *testing.T, open func(int, idem.Options) idem.Store) {
		s := open(0, idem.Options{})
		key := doKey("fp")
		runs := 0
		fn := func(context.Context) (string, error) { runs++; return "amount=10", nil }
		if _, err := idem.Do(t.Context(), s, key, fn, idem.DoOptions{Fingerprint: []byte("amount=10")}); err != nil {
			t.Fatalf("Do(%q) = %v; want nil", key, err)
		}
		v, err := idem.Do(t.Context(), s, key, fn, idem.DoOptions{Fingerprint: []byte("amount=99")})
		if !errors.Is(err, idem.ErrFingerprintMismatch) || v != "" || runs != 1 {
			t.Errorf("Do(%q) with another fingerprint = %q, %v (%d runs); want ErrFingerprintMismatch, no result, 1 run", key, v, err, runs)
		}
	})
}

// Bad input is an error naming what is wrong, before any call to the
// store.
func TestDoRefusesBadInputBeforeIO(t *testing.T) {
	s := &recordingStore{Store: memStore(idem.Options{})}
	fn := func(context.Context) (int, error) { return 1, nil }
	ctx := t.Context()
	for _, c := range []struct {
		name string
		do   func() error
		says string
	}{
		{"nil store", func() error { _, err := idem.Do(ctx, nil, "k", fn); return err }, "store is nil"},
		{"typed-nil store", func() error { _, err := idem.Do(ctx, (*idem.MemoryStore)(nil), "k", fn); return err }, "store is nil"},
		{"nil fn", func() error { _, err := idem.Do[int](ctx, s, "k", nil); return err }, "fn is nil"},
		{"empty key", func() error { _, err := idem.Do(ctx, s, "", fn); return err }, "empty key"},
		{"two DoOptions", func() error { _, err := idem.Do(ctx, s, "k", fn, idem.DoOptions{}, idem.DoOptions{}); return err }, "2 DoOptions"},
		{"negative Wait", func() error { _, err := idem.Do(ctx, s, "k", fn, idem.DoOptions{Wait: -time.Second}); return err }, "idem: DoOptions.Wait: -1s is negative; 0 means the default, 5s"},
		{"negative MaxHold", func() error { _, err := idem.Do(ctx, s, "k", fn, idem.DoOptions{MaxHold: -1}); return err }, "idem: DoOptions.MaxHold: -1ns is negative; 0 means the default, no cap"},
		{"nil sentinel", func() error {
			_, err := idem.Do(ctx, s, "k", fn, idem.DoOptions{Errors: []error{errDeclined, nil}})
			return err
		}, "idem: DoOptions.Errors[1]: nil matches no error"},
	} {
		if err := c.do(); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Do with %s = %v; want an error saying %q", c.name, err, c.says)
		}
	}
	if _, err := idem.Do(ctx, s, "", fn); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("Do with an empty key = %v; want ErrInvalidKey", err)
	}
	if n := s.calls.Load(); n != 0 {
		t.Errorf("the store saw %d calls; want none", n)
	}
}

// recordingStore counts calls and fails Confirm with its errors in turn
// (nil: the store's own Confirm).
type recordingStore struct {
	idem.Store
	calls, confirms atomic.Int64
	confirmErrs     func(n int64) error
}

func (s *recordingStore) Claim(ctx context.Context, key string, fp []byte) (idem.Claim, error) {
	s.calls.Add(1)
	return s.Store.Claim(ctx, key, fp)
}

func (s *recordingStore) Lookup(ctx context.Context, key string) (*idem.Record, error) {
	s.calls.Add(1)
	return s.Store.Lookup(ctx, key)
}

func (s *recordingStore) Confirm(ctx context.Context, l *idem.Lease, result []byte) error {
	s.calls.Add(1)
	n := s.confirms.Add(1)
	if s.confirmErrs != nil {
		if err := s.confirmErrs(n); err != nil {
			return err
		}
	}
	return s.Store.Confirm(ctx, l, result)
}

// A Confirm that fails after the work is done is retried within the
// lease, on a context the caller's cancellation does not end: the result
// is recorded and returned.
func TestDoRetriesConfirm(t *testing.T) {
	s := &recordingStore{Store: memStore(idem.Options{LeaseTTL: time.Second}),
		confirmErrs: func(n int64) error {
			if n < 3 {
				return errors.New("connection reset")
			}
			return nil
		}}
	ctx, cancel := context.WithCancel(t.Context())
	key := doKey("confirm")
	v, err := idem.Do(ctx, s, key, func(context.Context) (string, error) {
		cancel() // the caller gives up while fn runs: the record is still written
		return "charged", nil
	})
	if v != "charged" || err != nil || s.confirms.Load() != 3 {
		t.Fatalf("Do(%q) = %q, %v after %d Confirms; want \"charged\", nil after 3", key, v, err, s.confirms.Load())
	}
	if v, err := idem.Do(t.Context(), s, key, func(context.Context) (string, error) { return "again", nil }); v != "charged" || err != nil {
		t.Errorf("Do(%q) after the retried Confirm = %q, %v; want the recorded \"charged\"", key, v, err)
	}
}

// When no Confirm succeeds within the lease, Do returns fn's result with
// an error saying the work was done but not recorded. It retries within
// the lease and no longer: every attempt runs on a context that ends by
// the lease's end, as the code promises on a machine of any speed (a
// bound on Do's own time would also measure the machine's load).
func TestDoNotRecorded(t *testing.T) {
	const ttl = idem.MinLeaseTTL
	down := errors.New("store down")
	s := &unrecordingStore{Store: memStore(idem.Options{LeaseTTL: ttl}), err: down}
	v, err := idem.Do(t.Context(), s, doKey("unrecorded"), func(context.Context) (string, error) { return "charged", nil })
	if v != "charged" || !errors.Is(err, idem.ErrNotRecorded) || !errors.Is(err, down) {
		t.Errorf("Do with Confirm failing = %q, %v; want \"charged\" and an error matching ErrNotRecorded and the store's", v, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The lease ends TTL after the claim was sent, which was before its
	// call returned.
	end := s.claimed.Add(ttl)
	for i, a := range s.attempts {
		if !a.hasDeadline || a.deadline.After(end) {
			t.Errorf("Confirm %d ran on a context ending at %v (deadline set: %v); want by the lease's end, %v after the claim",
				i+1, a.deadline.Sub(s.claimed), a.hasDeadline, ttl)
		}
	}
	// A second attempt is due 5ms (jittered) after the first fails: a
	// first attempt that failed well before the lease's end leaves room.
	switch {
	case len(s.attempts) == 0:
		t.Errorf("Do made no Confirm; want retries within the lease")
	case len(s.attempts) == 1 && s.attempts[0].returned.Before(end.Add(-100*time.Millisecond)):
		t.Errorf("Do made one Confirm, failed %v before the lease's end; want retries within the lease",
			end.Sub(s.attempts[0].returned))
	}
}

// unrecordingStore fails every Confirm with err, noting when each was
// made and on what deadline, and when Claim returned.
type unrecordingStore struct {
	idem.Store
	err      error
	mu       sync.Mutex
	claimed  time.Time
	attempts []confirmAttempt
}

type confirmAttempt struct {
	deadline    time.Time
	hasDeadline bool
	returned    time.Time
}

func (s *unrecordingStore) Claim(ctx context.Context, key string, fp []byte) (idem.Claim, error) {
	c, err := s.Store.Claim(ctx, key, fp)
	s.mu.Lock()
	s.claimed = time.Now()
	s.mu.Unlock()
	return c, err
}

func (s *unrecordingStore) Confirm(ctx context.Context, _ *idem.Lease, _ []byte) error {
	d, ok := ctx.Deadline()
	s.mu.Lock()
	s.attempts = append(s.attempts, confirmAttempt{deadline: d, hasDeadline: ok, returned: time.Now()})
	s.mu.Unlock()
	return s.err
}

// Do's Confirm is retried on exactly the errors that the wrappers'
// (internal/retry) retry: package idem cannot import that package, so it
// keeps its own list, and this keeps the two the same.
func TestDoRetriesWhatRetryRetries(t *testing.T) {
	sentinels := []error{idem.ErrLeaseLost, idem.ErrNotFound, idem.ErrInvalidKey, idem.ErrTooLarge,
		idem.ErrInProgress, idem.ErrFingerprintMismatch, idem.ErrAlreadyConfirmed, idem.ErrInvalidLease,
		idem.ErrDamaged, idem.ErrNotRecorded, idem.ErrMaxHold, errors.New("connection reset")}
	for _, e := range sentinels {
		s := &recordingStore{Store: memStore(idem.Options{LeaseTTL: idem.MinLeaseTTL}),
			confirmErrs: func(n int64) error {
				if n == 1 {
					return fmt.Errorf("wrapped: %w", e)
				}
				return nil
			}}
		_, _ = idem.Do(t.Context(), s, doKey("retry"), func(context.Context) (int, error) { return 1, nil })
		if retried, want := s.confirms.Load() > 1, !retry.Permanent(e); retried != want {
			t.Errorf("Confirm failing with %v: retried = %v; want %v, as retry.Do", e, retried, want)
		}
	}
}

// []byte and string are recorded as they are, after the byte that marks a
// value; other types as JSON, or by the Codec given. A record that does
// not decode is ErrDamaged, not a zero value.
func TestDoEncoding(t *testing.T) {
	s := memStore(idem.Options{})
	ctx := t.Context()
	stored := func(key string) string {
		r, err := s.Lookup(ctx, key)
		if err != nil {
			t.Fatalf("Lookup(%q) = %v", key, err)
		}
		return string(r.Result)
	}
	k1, k2, k3 := doKey("bytes"), doKey("string"), doKey("json")
	_, _ = idem.Do(ctx, s, k1, func(context.Context) ([]byte, error) { return []byte{0, 1, '"'}, nil })
	_, _ = idem.Do(ctx, s, k2, func(context.Context) (string, error) { return "plain", nil })
	_, _ = idem.Do(ctx, s, k3, func(context.Context) (receipt, error) { return receipt{ID: "r1", Token: 9}, nil })
	for key, want := range map[string]string{k1: "v\x00\x01\"", k2: "vplain", k3: `v{"ID":"r1","Token":9}`} {
		if got := stored(key); got != want {
			t.Errorf("recorded result of %q = %q; want %q", key, got, want)
		}
	}
	if v, err := idem.Do(ctx, s, k1, func(context.Context) ([]byte, error) { return nil, nil }); string(v) != "\x00\x01\"" || err != nil {
		t.Errorf("replay of %q = %q, %v; want the bytes as they were", k1, v, err)
	}
	if v, err := idem.Do(ctx, s, k3, func(context.Context) (int, error) { return 0, nil }); !errors.Is(err, idem.ErrDamaged) {
		t.Errorf("replay of a receipt as an int = %d, %v; want ErrDamaged", v, err)
	}

	c := &upperCodec{}
	k4 := doKey("codec")
	for range 2 {
		if v, err := idem.Do(ctx, s, k4, func(context.Context) (string, error) { return "abc", nil }, idem.DoOptions{Codec: c}); v != "abc" || err != nil {
			t.Errorf("Do(%q) with a Codec = %q, %v; want \"abc\"", k4, v, err)
		}
	}
	// Two Unmarshals: the first caller's value is read back from the
	// record, as the replay's is.
	if got := stored(k4); got != "vABC" || c.marshal != 1 || c.unmarshal != 2 {
		t.Errorf("recorded %q with %d Marshal and %d Unmarshal calls; want \"vABC\", 1 and 2", got, c.marshal, c.unmarshal)
	}
}

// upperCodec records strings in upper case and reads them back in lower.
type upperCodec struct{ marshal, unmarshal int }

func (c *upperCodec) Marshal(v any) ([]byte, error) {
	c.marshal++
	return []byte(strings.ToUpper(v.(string))), nil
}

func (c *upperCodec) Unmarshal(data []byte, v any) error {
	c.unmarshal++
	*v.(*string) = strings.ToLower(string(data))
	return nil
}

// At the shortest lease a store accepts, KeepAlive keeps the key: eight
// callers three tenths of a lease apart, over three leases of work, run it
// once on every backend. Shorter leases are refused (TestBadOptionMessages):
// on a loaded machine 100ms leases ran the work twice now and then, 5ms
// and 10ms often, and a user's 1ms lease over a real network ran it eight
// times.
func TestDoAtTheShortestLeaseRunsOnce(t *testing.T) {
	onEveryBackend(t, func(t *testing.T, open func(int, idem.Options) idem.Store) {
		key := doKey("floor")
		var runs atomic.Int64
		var wg sync.WaitGroup
		for w := range 8 {
			s := open(w, idem.Options{LeaseTTL: idem.MinLeaseTTL})
			wg.Go(func() {
				_, _ = idem.Do(t.Context(), s, key, func(ctx context.Context) (int, error) {
					runs.Add(1)
					select {
					case <-time.After(3 * idem.MinLeaseTTL):
					case <-ctx.Done():
					}
					return 1, nil
				}, idem.DoOptions{Wait: 5 * time.Second})
			})
			time.Sleep(idem.MinLeaseTTL * 3 / 10)
		}
		wg.Wait()
		if n := runs.Load(); n != 1 {
			t.Errorf("8 callers of %q, LeaseTTL %v: the work ran %d times; want once", key, idem.MinLeaseTTL, n)
		}
	})
}

// A result type JSON cannot carry there and back is refused before any I/O
// and before fn runs: refused after, it would leave the work done and
// unrecorded, the key held for its lease, and done again after it.
func TestDoRefusesResultTypesJSONCannotRecord(t *testing.T) {
	s := &recordingStore{Store: memStore(idem.Options{})}
	ctx := t.Context()
	var ran atomic.Int64
	type order struct {
		ID   string
		Done chan struct{}
	}
	type hiddenReceipt struct{ id string }
	for _, c := range []struct {
		name string
		do   func() error
		says string
	}{
		{"chan", func() error {
			_, err := idem.Do(ctx, s, doKey("chan"), func(context.Context) (chan int, error) { ran.Add(1); return nil, nil })
			return err
		}, "chan int: JSON cannot encode a channel"},
		{"func", func() error {
			_, err := idem.Do(ctx, s, doKey("func"), func(context.Context) (func(), error) { ran.Add(1); return nil, nil })
			return err
		}, "func(): JSON cannot encode a func"},
		{"struct holding a chan", func() error {
			_, err := idem.Do(ctx, s, doKey("order"), func(context.Context) (*order, error) { ran.Add(1); return &order{}, nil })
			return err
		}, "Done (chan struct {}): JSON cannot encode a channel"},
		{"error", func() error {
			_, err := idem.Do(ctx, s, doKey("error"), func(context.Context) (error, error) { ran.Add(1); return nil, nil })
			return err
		}, "error: JSON cannot decode into an interface with methods"},
		{"unexported fields only", func() error {
			_, err := idem.Do(ctx, s, doKey("hidden"), func(context.Context) (hiddenReceipt, error) { ran.Add(1); return hiddenReceipt{"rcpt-1"}, nil })
			return err
		}, "its fields are all unexported"},
	} {
		err := c.do()
		if !errors.Is(err, idem.ErrResultType) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "DoOptions.Codec") {
			t.Errorf("Do returning a %s = %v; want ErrResultType saying %q and naming DoOptions.Codec", c.name, err, c.says)
		}
	}
	if n, calls := ran.Load(), s.calls.Load(); n != 0 || calls != 0 {
		t.Errorf("fn ran %d times and the store saw %d calls; want none", n, calls)
	}
	// A Codec takes the type over: Do does not second-guess it.
	if v, err := idem.Do(ctx, s, doKey("codec"), func(context.Context) (string, error) { return "abc", nil }, idem.DoOptions{Codec: &upperCodec{}}); v != "abc" || err != nil {
		t.Errorf("Do with a Codec = %q, %v; want \"abc\", nil", v, err)
	}
}

// The first caller gets the value every replay decodes, not fn's value as
// it was before the codec saw it.
func TestDoFirstCallerGetsWhatReplaysGet(t *testing.T) {
	s := memStore(idem.Options{})
	ctx := t.Context()
	type partly struct {
		ID   string
		note string
	}
	firstAndReplay := func(t *testing.T, name string, first, replay any, err1, err2 error) {
		t.Helper()
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: Do = %v, then %v; want nil", name, err1, err2)
		}
		if !reflect.DeepEqual(first, replay) {
			t.Errorf("%s: the first call got %#v, the replay %#v; want the same", name, first, replay)
		}
	}
	{
		key := doKey("int64-in-any")
		fn := func(context.Context) (any, error) { return int64(9007199254740993), nil }
		a, err1 := idem.Do(ctx, s, key, fn)
		b, err2 := idem.Do(ctx, s, key, fn)
		firstAndReplay(t, "an int64 in an any", a, b, err1, err2)
	}
	{
		key := doKey("partly-exported")
		fn := func(context.Context) (partly, error) { return partly{ID: "rcpt-1", note: "kept in memory only"}, nil }
		a, err1 := idem.Do(ctx, s, key, fn)
		b, err2 := idem.Do(ctx, s, key, fn)
		firstAndReplay(t, "unexported fields", a, b, err1, err2)
	}
	{
		key := doKey("nil-bytes")
		fn := func(context.Context) ([]byte, error) { return nil, nil }
		a, err1 := idem.Do(ctx, s, key, fn)
		b, err2 := idem.Do(ctx, s, key, fn)
		firstAndReplay(t, "a nil []byte", a, b, err1, err2)
	}
	{
		key := doKey("time")
		at := time.Date(2026, 12, 3, 9, 0, 0, 0, time.FixedZone("X", 3600)).Add(time.Duration(1))
		fn := func(context.Context) (time.Time, error) { return at, nil }
		a, err1 := idem.Do(ctx, s, key, fn)
		b, err2 := idem.Do(ctx, s, key, fn)
		firstAndReplay(t, "a time.Time", a, b, err1, err2)
	}
}

// A value that fails to encode once fn has run is recorded as the key's
// answer in its place: fn runs once, the caller gets fn's value and an
// error saying so, and a waiter and every later call get that error at
// once, instead of waiting out the lease and then running fn again.
func TestDoUnencodableValueAnswersItsKey(t *testing.T) {
	onEveryBackend(t, func(t *testing.T, open func(int, idem.Options) idem.Store) {
		holder, waiter := open(0, idem.Options{LeaseTTL: 10 * time.Second}), open(1, idem.Options{LeaseTTL: 10 * time.Second})
		key := doKey("nan")
		release, started := make(chan struct{}), make(chan struct{})
		var runs atomic.Int64
		fn := func(context.Context) (float64, error) {
			if runs.Add(1) == 1 {
				close(started)
				<-release
			}
			return math.NaN(), nil
		}
		type answer struct {
			v   float64
			err error
		}
		first, waited := make(chan answer, 1), make(chan answer, 1)
		go func() {
			v, err := idem.Do(t.Context(), holder, key, fn)
			first <- answer{v, err}
		}()
		<-started
		go func() {
			v, err := idem.Do(t.Context(), waiter, key, fn)
			waited <- answer{v, err}
		}()
		time.Sleep(50 * time.Millisecond)
		start := time.Now()
		close(release)
		a := <-first
		if !math.IsNaN(a.v) || !errors.Is(a.err, idem.ErrUnencodable) || !strings.Contains(a.err.Error(), "NaN") {
			t.Errorf("Do(%q) returning NaN = %v, %v; want NaN and ErrUnencodable naming it", key, a.v, a.err)
		}
		w := <-waited
		if !errors.Is(w.err, idem.ErrUnencodable) {
			t.Errorf("the waiter's Do(%q) = %v, %v; want ErrUnencodable", key, w.v, w.err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the waiter answered %v after fn returned; want well within the 10s lease", took)
		}
		v, err := idem.Do(t.Context(), waiter, key, fn)
		var p *idem.PermanentError
		if !errors.Is(err, idem.ErrUnencodable) || !errors.As(err, &p) || !p.Replayed {
			t.Errorf("a later Do(%q) = %v, %v; want the recorded ErrUnencodable, replayed", key, v, err)
		}
		if n := runs.Load(); n != 1 {
			t.Errorf("fn ran %d times; want once", n)
		}
	})
}

// A waiter polls with a growing backoff, not in a tight loop: over a wait
// of one second it asks the store a handful of times, and claims nothing.
func TestDoWaitDoesNotHammerTheStore(t *testing.T) {
	m := memStore(idem.Options{})
	key := doKey("poll")
	if c, err := m.Claim(t.Context(), key, nil); err != nil || c.Outcome != idem.Claimed {
		t.Fatalf("Claim(%q) = %v, %v; want claimed", key, c.Outcome, err)
	}
	s := &recordingStore{Store: m}
	_, err := idem.Do(t.Context(), s, key, func(context.Context) (int, error) { return 1, nil }, idem.DoOptions{Wait: time.Second})
	if !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("Do(%q) on a held key = %v; want ErrInProgress", key, err)
	}
	// 10ms doubling to 250ms, jittered by ±50%: at most 14 polls fit in 1s.
	if n := s.calls.Load(); n < 3 || n > 15 {
		t.Errorf("a 1s wait made %d store calls; want between 3 and 15", n)
	}
}

// crash claims key on s and abandons the lease, as a worker that dies
// after its effect would: no Confirm, no Forget. With cp it first records
// that checkpoint through the context KeepAlive gives the work. It waits
// (wait) until the lease has run out and returns it.
func crash(t *testing.T, s idem.Store, wait func(time.Duration), key string, cp []byte) *idem.Lease {
	t.Helper()
	c, err := s.Claim(t.Context(), key, nil)
	if err != nil || c.Outcome != idem.Claimed {
		t.Fatalf("Claim(%q) = %v, %v; want Claimed", key, c.Outcome, err)
	}
	if cp != nil {
		work, stop := idem.KeepAlive(t.Context(), s, c.Lease)
		if err := idem.Checkpoint(work, cp); err != nil {
			t.Fatalf("Checkpoint(KeepAlive's context, %q) = %v; want nil", cp, err)
		}
		stop()
	}
	wait(c.Lease.TTL + 50*time.Millisecond)
	return c.Lease
}

// After a take-over, Do asks Reconcile before running fn: told the effect
// landed, it records Reconcile's result and fn does not run; the earlier
// attempt and its checkpoint are what Reconcile is given.
func TestDoReconcileConfirmsALandedEffect(t *testing.T) {
	onEveryBackendClock(t, func(t *testing.T, open func(int, idem.Options) idem.Store, wait func(time.Duration)) {
		o := idem.Options{LeaseTTL: idem.MinLeaseTTL}
		crashed, next := open(0, o), open(1, o)
		key := doKey("reconciled")
		lost := crash(t, crashed, wait, key, []byte("charged:ch_1"))
		var got *idem.TakeOver
		ran := false
		v, err := idem.Do(t.Context(), next, key, func(context.Context) (string, error) {
			ran = true
			return "charged again", nil
		}, idem.DoOptions{Reconcile: func(ctx context.Context, tk *idem.TakeOver) (any, bool, error) {
			got = tk
			if l, ok := idem.LeaseFrom(ctx); !ok || l.Token <= lost.Token {
				t.Errorf("Reconcile's context lease = %v, %v; want the new lease, token above %d", l, ok, lost.Token)
			}
			return "ch_1", true, nil
		}})
		if v != "ch_1" || err != nil || ran {
			t.Fatalf("Do after a take-over Reconcile confirmed = %q, %v (fn ran: %v); want \"ch_1\", nil, fn not run", v, err, ran)
		}
		if got == nil || got.Prior.Token != lost.Token || got.Prior.Owner != lost.Owner || got.TakeOvers != 1 ||
			string(got.Checkpoint) != "charged:ch_1" {
			t.Errorf("Reconcile was given %+v; want the crashed attempt (owner %q, token %d), 1 take-over, checkpoint %q",
				got, lost.Owner, lost.Token, "charged:ch_1")
		}
		// Recorded: a later call replays it, and nothing is reconciled.
		v, err = idem.Do(t.Context(), next, key, func(context.Context) (string, error) {
			t.Errorf("fn ran on a key Reconcile recorded")
			return "", nil
		}, idem.DoOptions{Reconcile: func(context.Context, *idem.TakeOver) (any, bool, error) {
			t.Errorf("Reconcile called on a recorded key")
			return nil, false, nil
		}})
		if v != "ch_1" || err != nil {
			t.Errorf("Do after the reconciled record = %q, %v; want the replay \"ch_1\", nil", v, err)
		}
	})
}

// Told the effect did not land, Do runs fn, with the take-over in its
// context; fn may record a checkpoint through its context. A fresh key is
// never reconciled.
func TestDoReconcileRunsFnWhenNothingLanded(t *testing.T) {
	onEveryBackendClock(t, func(t *testing.T, open func(int, idem.Options) idem.Store, wait func(time.Duration)) {
		o := idem.Options{LeaseTTL: idem.MinLeaseTTL}
		crashed, next := open(0, o), open(1, o)
		key := doKey("not-landed")
		lost := crash(t, crashed, wait, key, nil)
		calls := 0
		opts := idem.DoOptions{Reconcile: func(context.Context, *idem.TakeOver) (any, bool, error) {
			calls++
			return nil, false, nil
		}}
		v, err := idem.Do(t.Context(), next, key, func(ctx context.Context) (int, error) {
			tk, ok := idem.TakeOverFrom(ctx)
			if !ok || tk.Prior.Token != lost.Token || tk.Checkpoint != nil {
				t.Errorf("TakeOverFrom(fn's context) = %+v, %v; want the crashed attempt, token %d, no checkpoint", tk, ok, lost.Token)
			}
			if err := idem.Checkpoint(ctx, []byte("step-1")); err != nil {
				t.Errorf("Checkpoint(fn's context) = %v; want nil", err)
			}
			return 7, nil
		}, opts)
		if v != 7 || err != nil || calls != 1 {
			t.Fatalf("Do after a take-over nothing landed = %d, %v (Reconcile called %d times); want 7, nil, once", v, err, calls)
		}
		fresh := doKey("fresh")
		v, err = idem.Do(t.Context(), next, fresh, func(ctx context.Context) (int, error) {
			if tk, ok := idem.TakeOverFrom(ctx); ok {
				t.Errorf("TakeOverFrom(fn's context) on a fresh key = %+v; want none", tk)
			}
			return 8, nil
		}, opts)
		if v != 8 || err != nil || calls != 1 {
			t.Errorf("Do(fresh key) = %d, %v (Reconcile calls %d); want 8, nil, Reconcile not called", v, err, calls)
		}
	})
}

// A Reconcile that cannot tell (an error, a result of another type) leaves
// the claim to run out unforgotten: the next call is told of a take-over
// again, the second in a row, and reconciles again.
func TestDoReconcileFailureLeavesTheClaim(t *testing.T) {
	onEveryBackendClock(t, func(t *testing.T, open func(int, idem.Options) idem.Store, wait func(time.Duration)) {
		o := idem.Options{LeaseTTL: idem.MinLeaseTTL}
		crashed, next := open(0, o), open(1, o)
		key := doKey("unreachable")
		crash(t, crashed, wait, key, []byte("cp"))
		errDown := errors.New("ledger unreachable")
		fn := func(context.Context) (int, error) {
			t.Errorf("fn ran though Reconcile could not tell")
			return 0, nil
		}
		_, err := idem.Do(t.Context(), next, key, fn, idem.DoOptions{Reconcile: func(context.Context, *idem.TakeOver) (any, bool, error) {
			return nil, false, errDown
		}})
		if !errors.Is(err, errDown) {
			t.Fatalf("Do with a failing Reconcile = %v; want its error", err)
		}
		rec, lerr := next.Lookup(t.Context(), key)
		const why = "Reconcile failed: ledger unreachable"
		if lerr != nil || rec.Confirmed || rec.Ended != why {
			t.Fatalf("Lookup(%q) after a failed Reconcile = %+v, %v; want the claim left live, not forgotten, Ended %q", key, rec, lerr, why)
		}
		wait(o.LeaseTTL + 50*time.Millisecond)
		_, err = idem.Do(t.Context(), next, key, fn, idem.DoOptions{Reconcile: func(_ context.Context, tk *idem.TakeOver) (any, bool, error) {
			if tk.TakeOvers != 2 || string(tk.Checkpoint) != "cp" {
				t.Errorf("second Reconcile given %+v; want the 2nd take-over, checkpoint %q carried", tk, "cp")
			}
			// Told the attempt before it failed to reconcile: not a crash.
			if tk.Prior.Ended != why {
				t.Errorf("second Reconcile told the attempt before it ended %q; want %q", tk.Prior.Ended, why)
			}
			return "not an int", true, nil
		}})
		if err == nil || !strings.Contains(err.Error(), "want fn's result type int") {
			t.Errorf("Do with Reconcile's result of another type = %v; want an error naming the type", err)
		}
		wait(o.LeaseTTL + 50*time.Millisecond)
		_, err = idem.Do(t.Context(), next, key, fn, idem.DoOptions{Reconcile: func(_ context.Context, tk *idem.TakeOver) (any, bool, error) {
			if !strings.HasPrefix(tk.Prior.Ended, "Reconcile failed: ") || !strings.Contains(tk.Prior.Ended, "want fn's result type int") {
				t.Errorf("third Reconcile told the attempt before it ended %q; want the type error", tk.Prior.Ended)
			}
			return 7, true, nil
		}})
		if err != nil {
			t.Errorf("Do with a third Reconcile that found the effect = %v; want nil", err)
		}
	})
}

// hangingAbandon is a store whose Abandon hangs until its context ends.
type hangingAbandon struct{ *idem.MemoryStore }

func (h hangingAbandon) Abandon(ctx context.Context, _ *idem.Lease, _ string) error {
	<-ctx.Done()
	return ctx.Err()
}

// Recording why a Reconcile failed never holds the caller's error up for
// long: a store that cannot take the reason (one that hangs, a Cache over
// a store that is no Abandoner) costs the caller at most a short bound,
// not the rest of the lease.
func TestDoAbandonIsBounded(t *testing.T) {
	o := idem.Options{LeaseTTL: 30 * time.Second}
	now := time.Now()
	for name, s := range map[string]idem.Store{
		"hanging": hangingAbandon{must(idem.NewMemoryStoreClock(o, func() time.Time { return now }))},
		"cache of a store that is no Abandoner": must(idem.NewCache(struct{ idem.Store }{
			must(idem.NewMemoryStoreClock(o, func() time.Time { return now }))}, idem.CacheOptions{})),
	} {
		c, err := s.Claim(t.Context(), "k", nil)
		if err != nil || c.Outcome != idem.Claimed {
			t.Fatalf("%s: Claim = %v, %v", name, c.Outcome, err)
		}
		now = now.Add(time.Minute) // the holder crashed
		errDown := errors.New("ledger unreachable")
		start := time.Now()
		_, err = idem.Do(t.Context(), s, "k", func(context.Context) (int, error) { return 1, nil },
			idem.DoOptions{Reconcile: func(context.Context, *idem.TakeOver) (any, bool, error) { return nil, false, errDown }})
		if took := time.Since(start); !errors.Is(err, errDown) || took > 15*time.Second {
			t.Errorf("%s: Do with a failing Reconcile = %v after %v; want its error well within the 30s lease", name, err, took)
		}
	}
}

// A key whose calls crashed more than MaxTakeOvers times in a row is
// quarantined: Do returns ErrQuarantined and runs neither Reconcile nor fn.
func TestDoQuarantined(t *testing.T) {
	onEveryBackendClock(t, func(t *testing.T, open func(int, idem.Options) idem.Store, wait func(time.Duration)) {
		o := idem.Options{LeaseTTL: idem.MinLeaseTTL, MaxTakeOvers: 1}
		a, b := open(0, o), open(1, o)
		key := doKey("poison")
		crash(t, a, wait, key, nil)
		crash(t, b, wait, key, nil) // the first take-over, crashed too
		_, err := idem.Do(t.Context(), a, key, func(context.Context) (int, error) {
			t.Errorf("fn ran on a quarantined key")
			return 0, nil
		}, idem.DoOptions{Reconcile: func(context.Context, *idem.TakeOver) (any, bool, error) {
			t.Errorf("Reconcile ran on a quarantined key")
			return nil, false, nil
		}})
		if !errors.Is(err, idem.ErrQuarantined) {
			t.Errorf("Do(%q) after %d crashes with MaxTakeOvers 1 = %v; want ErrQuarantined", key, 2, err)
		}
	})
}

// Checkpoint needs a context of held work, and a store that records
// checkpoints.
func TestCheckpointFromContext(t *testing.T) {
	if err := idem.Checkpoint(t.Context(), []byte("x")); err == nil {
		t.Errorf("Checkpoint(a context without a lease) = nil; want an error")
	}
	s := memStore(idem.Options{})
	c, err := s.Claim(t.Context(), doKey("cp"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := idem.Checkpoint(idem.ContextWithLease(t.Context(), c.Lease), []byte("x")); err == nil {
		t.Errorf("Checkpoint(ContextWithLease's context: no store) = nil; want an error")
	}
	held := func(s idem.Store) context.Context {
		return idem.ContextWithLease(idem.ContextWithStore(t.Context(), s), c.Lease)
	}
	if err := idem.Checkpoint(held(s), []byte("x")); err != nil {
		t.Errorf("Checkpoint(a context with the lease and its store) = %v; want nil", err)
	}
	plain := struct{ idem.Store }{s} // hides Checkpointer
	if err := idem.Checkpoint(held(plain), []byte("x")); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Checkpoint with a store that is no Checkpointer = %v; want errors.ErrUnsupported", err)
	}
	if err := s.Forget(t.Context(), c.Lease); err != nil {
		t.Fatal(err)
	}
	if err := idem.Checkpoint(held(s), []byte("x")); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Checkpoint after Forget = %v; want ErrLeaseLost", err)
	}
}

// An operator settles a quarantined key of Do's with the value in the
// form Do's docs give (Resolution.Result: the JSON of the value, a string
// as it is), and the next call replays it, decoded into T, without
// running fn; so does a waiter. Checked on every backend.
func TestDoReplaysAnOperatorsResult(t *testing.T) {
	onEveryBackendClock(t, func(t *testing.T, open func(int, idem.Options) idem.Store, wait func(time.Duration)) {
		o := idem.Options{LeaseTTL: idem.MinLeaseTTL, MaxTakeOvers: 1}
		a, b := open(0, o), open(1, o)
		fn := func(context.Context) (receipt, error) {
			t.Errorf("fn ran on a key an operator settled")
			return receipt{}, nil
		}
		key := doKey("settled")
		crash(t, a, wait, key, nil)
		crash(t, b, wait, key, nil)
		if _, err := idem.Do(t.Context(), a, key, fn); !errors.Is(err, idem.ErrQuarantined) {
			t.Fatalf("Do(%q) after 2 crashes with MaxTakeOvers 1 = %v; want ErrQuarantined", key, err)
		}
		res := idem.Resolution{Confirm: true, Result: []byte(`{"ID":"rcpt-9","Token":7}`)}
		if err := a.(idem.Resolver).Resolve(t.Context(), key, res); err != nil {
			t.Fatalf("Resolve(%q, %s) = %v; want nil", key, res.Result, err)
		}
		for _, s := range []idem.Store{a, b} {
			if v, err := idem.Do(t.Context(), s, key, fn); err != nil || v != (receipt{ID: "rcpt-9", Token: 7}) {
				t.Errorf("Do(%q) after the operator's Resolve = %+v, %v; want {rcpt-9 7}, nil", key, v, err)
			}
		}
		// A string as it is; the wrong type for the record is ErrDamaged,
		// naming the operator's result and the way out.
		key2 := doKey("settled-string")
		crash(t, a, wait, key2, nil)
		crash(t, b, wait, key2, nil)
		if _, err := idem.Do(t.Context(), a, key2, fn); !errors.Is(err, idem.ErrQuarantined) {
			t.Fatalf("Do(%q) after 2 crashes with MaxTakeOvers 1 = %v; want ErrQuarantined", key2, err)
		}
		if err := b.(idem.Resolver).Resolve(t.Context(), key2, idem.Resolution{Confirm: true, Result: []byte("rcpt-9")}); err != nil {
			t.Fatalf("Resolve(%q) = %v; want nil", key2, err)
		}
		if v, err := idem.Do(t.Context(), a, key2, func(context.Context) (string, error) { return "ran", nil }); err != nil || v != "rcpt-9" {
			t.Errorf("Do[string](%q) after the operator's Resolve = %q, %v; want \"rcpt-9\", nil", key2, v, err)
		}
		_, err := idem.Do(t.Context(), a, key2, fn)
		if !errors.Is(err, idem.ErrDamaged) || !strings.Contains(err.Error(), "operator") || !strings.Contains(err.Error(), "--force") {
			t.Errorf("Do[receipt](%q) on an operator's result %q = %v; want ErrDamaged naming the operator's result and --forget --force", key2, "rcpt-9", err)
		}
	})
}

// Reconcile's answers each do what DoOptions.Reconcile says: done with a
// nil result records T's zero value and fn does not run; a Permanent
// error is recorded and replayed as fn's would be; a panic leaves the
// claim to run out unforgotten, so that the next call is told of the
// take-over (the second in a row) and reconciles again.
func TestDoReconcileAnswers(t *testing.T) {
	onEveryBackendClock(t, func(t *testing.T, open func(int, idem.Options) idem.Store, wait func(time.Duration)) {
		o := idem.Options{LeaseTTL: idem.MinLeaseTTL}
		crashed, next := open(0, o), open(1, o)
		fnRuns := 0
		fn := func(context.Context) (int, error) { fnRuns++; return 5, nil }
		rc := func(r any, done bool, err error) idem.DoOptions {
			return idem.DoOptions{Reconcile: func(context.Context, *idem.TakeOver) (any, bool, error) { return r, done, err }}
		}

		zero := doKey("done-nil")
		crash(t, crashed, wait, zero, nil)
		if v, err := idem.Do(t.Context(), next, zero, fn, rc(nil, true, nil)); v != 0 || err != nil || fnRuns != 0 {
			t.Errorf("Do with Reconcile done, nil result = %d, %v (fn ran %d times); want 0, nil, fn not run", v, err, fnRuns)
		}
		if v, err := idem.Do(t.Context(), next, zero, fn); v != 0 || err != nil || fnRuns != 0 {
			t.Errorf("Do after Reconcile recorded T's zero value = %d, %v (fn ran %d times); want the replay 0, nil", v, err, fnRuns)
		}

		perm := doKey("permanent")
		crash(t, crashed, wait, perm, nil)
		errGone := errors.New("the order was cancelled")
		_, err := idem.Do(t.Context(), next, perm, fn, rc(nil, false, idem.Permanent(errGone)))
		if !errors.Is(err, errGone) || fnRuns != 0 {
			t.Errorf("Do with Reconcile's Permanent error = %v (fn ran %d times); want it, fn not run", err, fnRuns)
		}
		_, err = idem.Do(t.Context(), next, perm, fn)
		var pe *idem.PermanentError
		if !errors.As(err, &pe) || !pe.Replayed || err.Error() != errGone.Error() || fnRuns != 0 {
			t.Errorf("Do after Reconcile's Permanent error = %v (fn ran %d times); want the recorded error replayed, fn not run", err, fnRuns)
		}

		panicky := doKey("panic")
		crash(t, crashed, wait, panicky, nil)
		func() {
			defer func() {
				if p := recover(); p != "ledger client bug" {
					t.Errorf("Do with a panicking Reconcile: recovered %v; want the panic to go on", p)
				}
			}()
			_, _ = idem.Do(t.Context(), next, panicky, fn, idem.DoOptions{Reconcile: func(context.Context, *idem.TakeOver) (any, bool, error) {
				panic("ledger client bug")
			}})
		}()
		if rec, err := next.Lookup(t.Context(), panicky); err != nil || rec.Confirmed {
			t.Fatalf("Lookup(%q) after Reconcile panicked = %+v, %v; want the claim left live, not forgotten", panicky, rec, err)
		}
		wait(o.LeaseTTL + 50*time.Millisecond)
		told, ended := 0, ""
		v, err := idem.Do(t.Context(), next, panicky, fn, idem.DoOptions{Reconcile: func(_ context.Context, tk *idem.TakeOver) (any, bool, error) {
			told, ended = tk.TakeOvers, tk.Prior.Ended
			return nil, false, nil
		}})
		if v != 5 || err != nil || told != 2 || !strings.Contains(ended, "Reconcile panicked") {
			t.Errorf("Do after Reconcile panicked = %d, %v (told %d take-overs, the last ended %q); want 5, nil after Reconcile told of the 2nd take-over and the panic",
				v, err, told, ended)
		}
	})
}
