package consumer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
)

// panicked returns what f panicked with, as text; "" if it returned.
func panicked(f func()) (msg string) {
	defer func() {
		if v := recover(); v != nil {
			msg = fmt.Sprint(v)
		}
	}()
	f()
	return ""
}

// A mistake in building a wrapper panics at once, in the caller's
// goroutine, naming what is wrong: found on the first message instead, it
// would surface far from where it was made, or not at all.
func TestWrapperMistakesPanic(t *testing.T) {
	store := idem.NewMemoryStore(idem.Options{})
	nop := func(context.Context, msg) error { return nil }
	o := consumer.Options[msg]{}
	for _, tc := range []struct {
		name string
		opts []consumer.Options[msg]
		want string // after "consumer.Idempotent: " or "consumer.Batch: "
	}{
		{"two Options", []consumer.Options[msg]{o, o}, "2 Options; want at most one"},
		{"negative ConfirmBudget", []consumer.Options[msg]{{ConfirmBudget: -1}}, "negative Options.ConfirmBudget -1ns"},
		{"negative Concurrency", []consumer.Options[msg]{{Concurrency: -2}}, "negative Options.Concurrency -2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for fn, build := range map[string]func(){
				"consumer.Idempotent": func() { consumer.Idempotent(store, msgKey, nop, tc.opts...) },
				"consumer.Batch":      func() { consumer.Batch(store, msgKey, nop, tc.opts...) },
			} {
				if got, want := panicked(build), fn+": "+tc.want; got != want {
					t.Errorf("%s with %s: panic %q; want %q", fn, tc.name, got, want)
				}
			}
		})
	}
	if got := panicked(func() { consumer.Batch(store, msgKey, nop, consumer.Options[msg]{}) }); got != "" {
		t.Errorf("Batch with zero Options: panic %q; want none (zero means the defaults)", got)
	}
}
