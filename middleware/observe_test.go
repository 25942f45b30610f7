package middleware

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/obstest"
)

// One OpRequest event per request the middleware acts on, with the claim's
// outcome, the class of the idempotency layer's answer, and the keyed hash
// of the key as stored; none for a request it passes through.
func TestObserverRequestEvents(t *testing.T) {
	hasher, err := idem.NewKeyHasher([]byte("0123456789abcdef-shared"))
	if err != nil {
		t.Fatal(err)
	}
	obs := &obstest.Log{}
	b := newBlocker()
	h := mustNew(t, Options{SingleTenant: true, Store: memStore(idem.Options{}), Observer: obs, KeyHasher: hasher,
		LockTimeout: 20 * time.Millisecond}, b)

	first := make(chan int)
	go func() { first <- do(h, req{key: "k1", body: `{"a":1}`}).Code }()
	<-b.started
	if w := do(h, req{key: "k1", body: `{"a":1}`}); w.Code != 409 {
		t.Fatalf("concurrent = %d; want 409", w.Code)
	}
	close(b.release)
	if code := <-first; code != 201 {
		t.Fatalf("first = %d; want 201", code)
	}
	steps := []struct {
		q      req
		status int
	}{
		{req{key: "k1", body: `{"a":1}`}, 201},        // replay
		{req{key: "k1", body: `{"a":2}`}, 422},        // another request under k1
		{req{key: `"unterminated`, body: `{}`}, 400},  // malformed key
		{req{body: `{}`}, 201},                        // no key: passed through, no event
		{req{method: http.MethodGet, key: "k1"}, 201}, // not covered: no event
	}
	for _, s := range steps {
		if w := do(h, s.q); w.Code != s.status {
			t.Fatalf("%+v = %d; want %d", s.q, w.Code, s.status)
		}
	}

	sk := storeKey("", "k1")
	want := []struct {
		outcome idem.Outcome
		class   idem.ErrorClass
		hash    string
	}{
		{idem.InProgress, idem.ClassConflict, hasher.Hash(sk)},
		{idem.Claimed, idem.ClassNone, hasher.Hash(sk)},
		{idem.Duplicate, idem.ClassNone, hasher.Hash(sk)},
		{idem.Duplicate, idem.ClassConflict, hasher.Hash(sk)},
		{0, idem.ClassInvalid, ""},
	}
	got := obs.Of(idem.OpRequest)
	if all, _ := obs.All(); len(got) != len(want) || len(all) != len(want) {
		t.Fatalf("%d events (%d OpRequest); want %d OpRequest only: %+v", len(all), len(got), len(want), all)
	}
	for i, w := range want {
		e := got[i]
		if e.Outcome != w.outcome || e.Class() != w.class || e.KeyHash != w.hash || e.Items != 1 {
			t.Errorf("event %d = {Outcome %v, Class %q, KeyHash %q, Items %d}; want {%v, %q, %q, 1}",
				i, e.Outcome, e.Class(), e.KeyHash, e.Items, w.outcome, w.class, w.hash)
		}
	}
	if got[0].Took < 20*time.Millisecond {
		t.Errorf("the 409's Took = %v; want the whole request, LockTimeout of waiting included", got[0].Took)
	}
	if got[1].Took <= 0 {
		t.Errorf("first request's Took = %v; want > 0", got[1].Took)
	}
}

// A store failure and an unrecorded response are reported with the
// store's error.
func TestObserverStoreErrors(t *testing.T) {
	obs := &obstest.Log{}
	s := newCounting()
	s.claimErr = errStoreDown
	h := mustNew(t, Options{SingleTenant: true, Store: s, Observer: obs}, &counter{})
	if w := do(h, req{key: "k", body: `{}`}); w.Code != 503 {
		t.Fatalf("store down = %d; want 503", w.Code)
	}
	s.claimErr = nil
	s.confirmErr.Store(1 << 20) // every Confirm fails
	h = mustNew(t, Options{SingleTenant: true, Store: s, Observer: obs, RecordTimeout: 30 * time.Millisecond}, &counter{})
	if w := do(h, req{key: "k2", body: `{}`}); w.Code != 201 {
		t.Fatalf("unrecorded = %d; want 201 (the work was done)", w.Code)
	}
	got := obs.Of(idem.OpRequest)
	if len(got) != 2 {
		t.Fatalf("%d events; want 2", len(got))
	}
	if !errors.Is(got[0].Err, errStoreDown) || got[0].Class() != idem.ClassStore || got[0].Outcome != 0 {
		t.Errorf("store down: event {%v, %v, %v}; want the store's error, class store, no outcome", got[0].Outcome, got[0].Class(), got[0].Err)
	}
	if got[1].Outcome != idem.Claimed || !errors.Is(got[1].Err, errStoreDown) {
		t.Errorf("unrecorded: event {%v, %v}; want Claimed with the Confirm's error", got[1].Outcome, got[1].Err)
	}
}

// A Starter is started before the first store call; the store's events and
// the handler run on the context it returned, and the request's event is
// observed on it too.
func TestObserverStarter(t *testing.T) {
	obs := &obstest.Starter{}
	store := memStore(idem.Options{Observer: obs})
	var handlerInside bool
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op, ok := obstest.StartedOp(r.Context())
		handlerInside = ok && op == idem.OpRequest
		w.WriteHeader(201)
	})
	h := mustNew(t, Options{SingleTenant: true, Store: store, Observer: obs}, next)
	if w := do(h, req{key: "k", body: `{}`}); w.Code != 201 {
		t.Fatalf("status %d", w.Code)
	}
	if started := obs.Started(); len(started) != 1 || started[0] != idem.OpRequest {
		t.Errorf("started %v; want [request]", started)
	}
	if !handlerInside {
		t.Error("the handler's context is not the started one")
	}
	var ops []idem.Op
	events, inside := obs.All()
	for i, e := range events {
		ops = append(ops, e.Op)
		if !inside[i] {
			t.Errorf("event %v observed outside the started context", e.Op)
		}
	}
	if len(ops) != 3 || ops[0] != idem.OpClaim || ops[1] != idem.OpConfirm || ops[2] != idem.OpRequest {
		t.Errorf("events %v; want [claim confirm request]", ops)
	}
}

// A panic still ends its request's event.
func TestObserverPanic(t *testing.T) {
	obs := &obstest.Log{}
	h := mustNew(t, Options{SingleTenant: true, Store: memStore(idem.Options{}), Observer: obs},
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	func() {
		defer func() { _ = recover() }()
		do(h, req{key: "k", body: `{}`})
	}()
	got := obs.Of(idem.OpRequest)
	if len(got) != 1 || got[0].Err != nil || got[0].Outcome != idem.Claimed {
		t.Errorf("events %+v; want one, Claimed, without an error (the handler's failure is its own)", got)
	}
	// A panic before the claim (here in Scope) is reported as such.
	h = mustNew(t, Options{Store: memStore(idem.Options{}), Observer: obs,
		Scope: func(*http.Request) (string, error) { panic("scope") }}, &counter{})
	func() {
		defer func() { _ = recover() }()
		do(h, req{key: "k", body: `{}`})
	}()
	got = obs.Of(idem.OpRequest)
	if len(got) != 2 || !errors.Is(got[1].Err, errPanicked) || got[1].Outcome != 0 {
		t.Errorf("events %+v; want a second one with errPanicked and no outcome", got)
	}
}
