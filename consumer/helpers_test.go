package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
)

// spyStore counts a store's calls and injects failures. Embedding the
// Store interface hides the Batcher methods: spyBatcher adds them back.
type spyStore struct {
	idem.Store
	mu    sync.Mutex
	calls map[string]int
	// fail, when set for an op, is asked before every call of it (n counts
	// that op's calls from 1); a non-nil error fails the call without
	// reaching the store.
	fail map[string]func(n int) error
}

func spy(s idem.Store) *spyStore {
	return &spyStore{Store: s, calls: map[string]int{}, fail: map[string]func(int) error{}}
}

var errDown = errors.New("test: store unavailable")

func (s *spyStore) op(name string) error {
	s.mu.Lock()
	s.calls[name]++
	n, f := s.calls[name], s.fail[name]
	s.mu.Unlock()
	if f != nil {
		return f(n)
	}
	return nil
}

func (s *spyStore) setFail(op string, f func(n int) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail[op] = f
}

func (s *spyStore) count(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[op]
}

func (s *spyStore) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.calls {
		n += c
	}
	return n
}

func (s *spyStore) Claim(ctx context.Context, key string, fp []byte) (idem.Claim, error) {
	if err := s.op("claim"); err != nil {
		return idem.Claim{}, err
	}
	return s.Store.Claim(ctx, key, fp)
}

func (s *spyStore) Renew(ctx context.Context, l *idem.Lease) error {
	if err := s.op("renew"); err != nil {
		return err
	}
	return s.Store.Renew(ctx, l)
}

func (s *spyStore) Confirm(ctx context.Context, l *idem.Lease, r []byte) error {
	if err := s.op("confirm"); err != nil {
		return err
	}
	return s.Store.Confirm(ctx, l, r)
}

func (s *spyStore) Forget(ctx context.Context, l *idem.Lease) error {
	if err := s.op("forget"); err != nil {
		return err
	}
	return s.Store.Forget(ctx, l)
}

func (s *spyStore) Lookup(ctx context.Context, key string) (*idem.Record, error) {
	if err := s.op("lookup"); err != nil {
		return nil, err
	}
	return s.Store.Lookup(ctx, key)
}

// spyBatcher is a spyStore whose store is a Batcher.
type spyBatcher struct{ *spyStore }

func (s spyBatcher) ClaimBatch(ctx context.Context, keys []string, fps [][]byte) ([]idem.Claim, error) {
	if err := s.op("claim_batch"); err != nil {
		return nil, err
	}
	return s.Store.(idem.Batcher).ClaimBatch(ctx, keys, fps)
}

func (s spyBatcher) ConfirmBatch(ctx context.Context, ls []*idem.Lease, rs [][]byte) error {
	if err := s.op("confirm_batch"); err != nil {
		return err
	}
	return s.Store.(idem.Batcher).ConfirmBatch(ctx, ls, rs)
}

// events records what a Hook is told.
type events struct {
	mu sync.Mutex
	es []consumer.Event
}

func (e *events) hook(_ context.Context, ev consumer.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.es = append(e.es, ev)
}

func (e *events) kinds() []consumer.Kind {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ks []consumer.Kind
	for _, ev := range e.es {
		ks = append(ks, ev.Kind)
	}
	return ks
}

func (e *events) has(k consumer.Kind) bool {
	for _, x := range e.kinds() {
		if x == k {
			return true
		}
	}
	return false
}

// msg is the message type of the tests.
type msg struct {
	ID   string
	Body string
}

func msgKey(m msg) string { return m.ID }

// uniq returns a key unique to the test.
func uniq(t testing.TB, s string) string {
	return fmt.Sprintf("%s/%s", t.Name(), s)
}

func confirmed(t *testing.T, s idem.Store, key string) bool {
	t.Helper()
	r, err := s.Lookup(context.Background(), key)
	if errors.Is(err, idem.ErrNotFound) {
		return false
	}
	if err != nil {
		t.Fatalf("Lookup(%q): %v", key, err)
	}
	return r.Confirmed
}
