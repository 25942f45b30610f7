package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
)

// ActionFor is the one table every adapter settles by: a wrapper's error,
// as the wrappers wrap it, maps to exactly one action.
func TestActionFor(t *testing.T) {
	storeDown := errors.New("dial tcp: connection refused")
	handlerFailed := errors.New("payment gateway said no")
	notRecorded := fmt.Errorf("%w: key k token 7: %w", consumer.ErrNotRecorded, storeDown)
	for _, tc := range []struct {
		name string
		err  error
		want consumer.Action
	}{
		{"done or duplicate", nil, consumer.Ack},
		{"done but not recorded", notRecorded, consumer.AckAndAlert},
		{"not recorded, budget ran out", errors.Join(notRecorded, context.DeadlineExceeded), consumer.AckAndAlert},
		// The store's error inside says the lease is gone; the work was done all the same.
		{"not recorded, lease lost", fmt.Errorf("%w: %w", consumer.ErrNotRecorded, idem.ErrLeaseLost), consumer.AckAndAlert},
		{"in progress", fmt.Errorf("%w: key held", idem.ErrInProgress), consumer.Redeliver},
		{"handler failed", handlerFailed, consumer.Redeliver},
		{"handler saw its lease lost", fmt.Errorf("charge: %w", idem.ErrLeaseLost), consumer.Redeliver},
		{"store down", storeDown, consumer.Redeliver},
		{"context ended", context.Canceled, consumer.Redeliver},
		{"empty key", fmt.Errorf("%w: the message's key is empty", idem.ErrInvalidKey), consumer.DeadLetter},
		{"oversized fingerprint", fmt.Errorf("claim: %w", idem.ErrTooLarge), consumer.DeadLetter},
		{"fingerprint mismatch", fmt.Errorf("claim k: %w", idem.ErrFingerprintMismatch), consumer.DeadLetter},
		{"damaged record", fmt.Errorf("claim k: %w", idem.ErrDamaged), consumer.DeadLetter},
		// No redelivery runs until an operator settles the key; an ack would lose it.
		{"quarantined", fmt.Errorf("claim k: %w", idem.ErrQuarantined), consumer.DeadLetter},
	} {
		if got := consumer.ActionFor(tc.err); got != tc.want {
			t.Errorf("%s: ActionFor(%v) = %v; want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// What the wrapper itself returns maps as the package documentation says:
// checked on the real errors, not on hand-made ones.
func TestActionForWrapperErrors(t *testing.T) {
	ctx := context.Background()
	mem, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := spy(mem)
	fail := errors.New("handler failed")
	h := consumer.Idempotent(s, func(m msg) string { return m.ID }, func(_ context.Context, m msg) error {
		if m.Body == "fail" {
			return fail
		}
		return nil
	}, consumer.Options[msg]{Fingerprint: func(m msg) []byte { return []byte(m.Body) }, ConfirmBudget: 20 * time.Millisecond})

	check := func(what string, m msg, want consumer.Action) {
		t.Helper()
		err := h(ctx, m)
		if got := consumer.ActionFor(err); got != want {
			t.Errorf("%s: ActionFor(%v) = %v; want %v", what, err, got, want)
		}
	}
	check("first delivery", msg{ID: "a", Body: "x"}, consumer.Ack)
	check("duplicate", msg{ID: "a", Body: "x"}, consumer.Ack)
	check("fingerprint mismatch", msg{ID: "a", Body: "y"}, consumer.DeadLetter)
	check("empty key", msg{ID: "", Body: "x"}, consumer.DeadLetter)
	check("handler failed", msg{ID: "b", Body: "fail"}, consumer.Redeliver)
	if _, err := mem.Claim(ctx, "c", []byte("x")); err != nil {
		t.Fatal(err)
	}
	check("in progress", msg{ID: "c", Body: "x"}, consumer.Redeliver)
	s.setFail("claim", func(int) error { return errDown })
	check("store down at claim", msg{ID: "d", Body: "x"}, consumer.Redeliver)
	s.setFail("claim", nil)
	s.setFail("confirm", func(int) error { return errDown })
	check("confirm failing past its budget", msg{ID: "e", Body: "x"}, consumer.AckAndAlert)
}

func TestActionString(t *testing.T) {
	for a, want := range map[consumer.Action]string{
		consumer.Ack: "ack", consumer.Redeliver: "redeliver", consumer.AckAndAlert: "ack_and_alert",
		consumer.DeadLetter: "dead_letter", 0: "action(0)", 9: "action(9)",
	} {
		if got := a.String(); got != want {
			t.Errorf("Action(%d).String() = %q; want %q", uint8(a), got, want)
		}
	}
}
