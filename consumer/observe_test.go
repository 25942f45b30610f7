package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/internal/testing/obstest"
)

var errFailing = errors.New("test: the handler failed")

// failing fails the messages whose body is "fail".
func failing(_ context.Context, m msg) error {
	if m.Body == "fail" {
		return errFailing
	}
	return nil
}

func wantMessage(t *testing.T, what string, e idem.Event, outcome idem.Outcome, class idem.ErrorClass, hash string) {
	t.Helper()
	if e.Op != idem.OpMessage || e.Outcome != outcome || e.Class() != class || e.KeyHash != hash || e.Items != 1 || e.Took <= 0 {
		t.Errorf("%s: event {%v %v class %q hash %q items %d took %v}; want {message %v class %q hash %q items 1 took > 0}",
			what, e.Op, e.Outcome, e.Class(), e.KeyHash, e.Items, e.Took, outcome, class, hash)
	}
}

// One OpMessage event per message: Claimed for work done (and for a
// handler's own failure, which is not the store's), Duplicate for a
// redelivery, conflict for a key held elsewhere, invalid for an empty key,
// with the configured KeyHasher's hash.
func TestObserverMessageEvents(t *testing.T) {
	hasher, err := idem.NewKeyHasher([]byte("shared-secret-of-the-fleet"))
	if err != nil {
		t.Fatal(err)
	}
	store := memStore(idem.Options{})
	obs := &obstest.Log{}
	h := consumer.Idempotent(store, msgKey, failing, consumer.Options[msg]{Observer: obs, KeyHasher: hasher})
	ctx := context.Background()
	held, err := store.Claim(ctx, "held", nil)
	if err != nil || held.Outcome != idem.Claimed {
		t.Fatalf("Claim(held) = %v, %v", held.Outcome, err)
	}
	for _, m := range []msg{{ID: "a"}, {ID: "a"}, {ID: "b", Body: "fail"}, {ID: "held"}, {ID: ""}} {
		_ = h(ctx, m)
	}
	got := obs.Of(idem.OpMessage)
	if all, _ := obs.All(); len(got) != 5 || len(all) != 5 {
		t.Fatalf("%d events, %d of them messages; want 5 messages", len(all), len(got))
	}
	wantMessage(t, "first", got[0], idem.Claimed, idem.ClassNone, hasher.Hash("a"))
	wantMessage(t, "redelivery", got[1], idem.Duplicate, idem.ClassNone, hasher.Hash("a"))
	wantMessage(t, "handler failed", got[2], idem.Claimed, idem.ClassNone, hasher.Hash("b"))
	wantMessage(t, "held", got[3], idem.InProgress, idem.ClassConflict, hasher.Hash("held"))
	wantMessage(t, "empty key", got[4], 0, idem.ClassInvalid, "")
}

// Batch reports each message of the batch; a Starter starts each message,
// its handler and its event get that context, and the batch's own store
// calls run outside any message.
func TestObserverBatchEvents(t *testing.T) {
	obs := &obstest.Starter{}
	store := memStore(idem.Options{Observer: obs})
	ctx := context.Background()
	if err := consumer.Idempotent(store, msgKey, failing)(ctx, msg{ID: "done"}); err != nil {
		t.Fatal(err)
	}
	obs.Reset()
	handlerStarted := map[string]bool{}
	var mu sync.Mutex
	h := func(ctx context.Context, m msg) error {
		mu.Lock()
		_, handlerStarted[m.ID] = obstest.StartedOp(ctx)
		mu.Unlock()
		return failing(ctx, m)
	}
	b := consumer.Batch(store, msgKey, h, consumer.Options[msg]{Observer: obs})
	errs := b(ctx, []msg{{ID: "x"}, {ID: "done"}, {ID: "y", Body: "fail"}, {ID: "x"}})
	if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], errFailing) || errs[3] != nil {
		t.Fatalf("errs = %v", errs)
	}
	if n := len(obs.Started()); n != 4 {
		t.Errorf("started %d messages; want 4", n)
	}
	if !handlerStarted["x"] || !handlerStarted["y"] {
		t.Errorf("handlers ran on started contexts: %v; want all", handlerStarted)
	}
	got := obs.Of(idem.OpMessage)
	if len(got) != 4 {
		t.Fatalf("%d message events; want 4", len(got))
	}
	wantMessage(t, "x", got[0], idem.Claimed, idem.ClassNone, idem.KeyHash("x"))
	wantMessage(t, "done", got[1], idem.Duplicate, idem.ClassNone, idem.KeyHash("done"))
	wantMessage(t, "y", got[2], idem.Claimed, idem.ClassNone, idem.KeyHash("y"))
	// The repeated key, claimed in a round after the first x: done.
	wantMessage(t, "x again", got[3], idem.Duplicate, idem.ClassNone, idem.KeyHash("x"))
	events, inside := obs.All()
	for i, e := range events {
		// The batch calls serve every message; a message's own Forget and
		// its event run on its context.
		batchOp := e.Op == idem.OpClaimBatch || e.Op == idem.OpConfirmBatch
		if inside[i] == batchOp {
			t.Errorf("event %v observed inside a message = %v; want %v", e.Op, inside[i], !batchOp)
		}
	}
}

// An unrecorded success is reported with ErrNotRecorded and the store's
// error; the store's events nest in the started message.
func TestObserverNotRecorded(t *testing.T) {
	obs := &obstest.Starter{}
	s := spy(memStore(idem.Options{Observer: obs}))
	s.setFail("confirm", func(int) error { return errDown })
	h := consumer.Idempotent(s, msgKey, failing, consumer.Options[msg]{Observer: obs, ConfirmBudget: 20 * time.Millisecond})
	if err := h(context.Background(), msg{ID: "k"}); !errors.Is(err, consumer.ErrNotRecorded) {
		t.Fatalf("err = %v; want ErrNotRecorded", err)
	}
	got := obs.Of(idem.OpMessage)
	if len(got) != 1 || got[0].Outcome != idem.Claimed || !errors.Is(got[0].Err, consumer.ErrNotRecorded) ||
		!errors.Is(got[0].Err, errDown) || got[0].Class() == idem.ClassNone {
		t.Fatalf("events %+v; want one Claimed with ErrNotRecorded and the store's error", got)
	}
	events, inside := obs.All()
	for i, e := range events {
		if !inside[i] {
			t.Errorf("event %v outside the started message", e.Op)
		}
	}
}

// Work whose confirmation lost to another delivery's is not a failure of
// the message: its event is Claimed without error, and Confirm is not
// retried (the answer is final).
func TestObserverAlreadyConfirmed(t *testing.T) {
	obs := &obstest.Log{}
	s := spy(memStore(idem.Options{}))
	s.setFail("confirm", func(int) error { return fmt.Errorf("%w: confirm of k", idem.ErrAlreadyConfirmed) })
	var ev events
	h := consumer.Idempotent(s, msgKey, failing, consumer.Options[msg]{Observer: obs, Hook: ev.hook})
	if err := h(context.Background(), msg{ID: "k"}); err != nil {
		t.Fatalf("err = %v; want nil (done)", err)
	}
	got := obs.Of(idem.OpMessage)
	if len(got) != 1 {
		t.Fatalf("%d message events; want 1", len(got))
	}
	wantMessage(t, "already confirmed", got[0], idem.Claimed, idem.ClassNone, idem.KeyHash("k"))
	if n := s.count("confirm"); n != 1 || !ev.has(consumer.AlreadyConfirmed) {
		t.Fatalf("Confirm called %d times, hook saw %v; want 1 call and already_confirmed", n, ev.kinds())
	}
}
