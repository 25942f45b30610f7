package consumer_test

import (
	"context"
	"fmt"
	"strings"
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
// would surface far from where it was made (a nil store in KeepAlive's
// goroutine, a nil handler after its message was claimed).
func TestWrapperMistakesPanic(t *testing.T) {
	store := memStore(idem.Options{})
	nop := func(context.Context, msg) error { return nil }
	o := consumer.Options[msg]{}
	type args struct {
		store idem.Store
		key   func(msg) string
		h     func(context.Context, msg) error
		opts  []consumer.Options[msg]
	}
	for _, tc := range []struct {
		name string
		args args
		want string // after "consumer.Idempotent: " or "consumer.Batch: ", or whole when it starts "consumer: "; "" for no panic
	}{
		{"valid", args{store, msgKey, nop, nil}, ""},
		{"zero Options", args{store, msgKey, nop, []consumer.Options[msg]{o}}, ""},
		{"nil store", args{nil, msgKey, nop, nil}, "nil store"},
		{"typed nil store", args{(*idem.MemoryStore)(nil), msgKey, nop, nil}, "store (*idem.MemoryStore)(nil) is nil and would panic on the first message"},
		{"nil key func", args{store, nil, nop, nil}, "nil key func"},
		{"nil handler", args{store, msgKey, nil, nil}, "nil handler"},
		{"two Options", args{store, msgKey, nop, []consumer.Options[msg]{o, o}}, "2 Options; want at most one"},
		{"negative ConfirmBudget", args{store, msgKey, nop, []consumer.Options[msg]{{ConfirmBudget: -1}}}, "consumer: ConfirmBudget: -1ns is negative; 0 means the default, two thirds of the lease's TTL"},
		{"negative Concurrency", args{store, msgKey, nop, []consumer.Options[msg]{{Concurrency: -2}}}, "consumer: Concurrency: -2 is negative; 0 means the default, 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.args
			for fn, build := range map[string]func(){
				"consumer.Idempotent": func() { consumer.Idempotent(a.store, a.key, a.h, a.opts...) },
				"consumer.Batch":      func() { consumer.Batch(a.store, a.key, a.h, a.opts...) },
			} {
				want := tc.want
				if want != "" && !strings.HasPrefix(want, "consumer: ") {
					want = fn + ": " + want
				}
				if got := panicked(build); got != want {
					t.Errorf("%s with %s: panic %q; want %q", fn, tc.name, got, want)
				}
			}
		})
	}
}
