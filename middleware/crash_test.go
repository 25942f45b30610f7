package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/crashstore"
)

// eventLog is an Observer that keeps the events.
type eventLog struct {
	mu sync.Mutex
	ev []idem.Event
}

func (o *eventLog) Observe(_ context.Context, e idem.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ev = append(o.ev, e)
}

func (o *eventLog) last() idem.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ev[len(o.ev)-1]
}

// A server that dies mid-handler leaves the key's claim to run out; the
// next server's handler is told of the take-over in its request's context
// (idem.TakeOverFrom) and its event says so. When that one dies too (with
// MaxTakeOvers 1), the key is quarantined: 423 TypeQuarantined, not
// retryable, the handler does not run, the event's class is quarantined.
func TestQuarantinedAfterCrashes(t *testing.T) {
	const lease = idem.MinLeaseTTL
	shared := memStore(idem.Options{LeaseTTL: lease, MaxTakeOvers: 1})
	var obs eventLog
	var seen []*idem.TakeOver
	var mu sync.Mutex
	server := func(worker string, dies bool) (http.Handler, *crashstore.Store) {
		st := &crashstore.Store{Store: must(shared.Share(idem.Options{Worker: worker, LeaseTTL: lease, MaxTakeOvers: 1})),
			Unconfirmed: new(sync.Map)}
		h := mustNew(t, Options{SingleTenant: true, Store: st, Observer: &obs, RecordTimeout: lease},
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tk, _ := idem.TakeOverFrom(r.Context())
				mu.Lock()
				seen = append(seen, tk)
				mu.Unlock()
				if dies {
					st.Dead.Store(true) // the process dies: no Confirm, no Forget, no renewal
				}
				w.WriteHeader(http.StatusCreated)
			}))
		return h, st
	}
	first, _ := server("a", true)
	do(first, req{key: "k", body: "{}"})
	time.Sleep(2 * lease)
	second, _ := server("b", true)
	do(second, req{key: "k", body: "{}"})
	if e := obs.last(); !e.TakeOver || e.Outcome != idem.Claimed {
		t.Errorf("the second request's event = %+v; want Claimed with TakeOver", e)
	}
	mu.Lock()
	if len(seen) != 2 || seen[0] != nil || seen[1] == nil || seen[1].Prior.Owner != "a" || seen[1].TakeOvers != 1 {
		t.Errorf("take-overs seen by the handlers = %+v; want none, then the first server's attempt (owner a)", seen)
	}
	mu.Unlock()
	time.Sleep(2 * lease)
	third, _ := server("c", false)
	w := do(third, req{key: "k", body: "{}"})
	wantProblem(t, w, 423, TypeQuarantined)
	var p Problem
	_ = json.Unmarshal(w.Body.Bytes(), &p)
	if p.Retryable || p.IdempotencyKey != "k" || w.Header().Get("Retry-After") != "" {
		t.Errorf("quarantined problem = %+v, Retry-After %q; want not retryable, the key, no Retry-After", p, w.Header().Get("Retry-After"))
	}
	mu.Lock()
	if len(seen) != 2 {
		t.Errorf("handler ran %d times; want 2 (not for the quarantined key)", len(seen))
	}
	mu.Unlock()
	if e := obs.last(); e.Class() != idem.ClassQuarantined || !errors.Is(e.Err, idem.ErrQuarantined) {
		t.Errorf("the quarantined request's event = %+v; want class quarantined", e)
	}
}
