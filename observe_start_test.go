package idem_test

import (
	"context"
	"testing"

	"github.com/idemgo/idem"
)

type startKey struct{}

// startingObserver records the ops it is started for, and marks the context.
type startingObserver struct {
	name    string
	started []idem.Op
}

func (s *startingObserver) Observe(context.Context, idem.Event) {}

func (s *startingObserver) Start(ctx context.Context, op idem.Op) context.Context {
	s.started = append(s.started, op)
	prev, _ := ctx.Value(startKey{}).(string)
	return context.WithValue(ctx, startKey{}, prev+s.name)
}

type plainObserver struct{}

func (plainObserver) Observe(context.Context, idem.Event) {}

func TestObserversStart(t *testing.T) {
	a, b := &startingObserver{name: "a"}, &startingObserver{name: "b"}
	obs := idem.Observers(a, plainObserver{}, b)
	s, ok := obs.(idem.Starter)
	if !ok {
		t.Fatal("Observers of several is not a Starter")
	}
	ctx := s.Start(context.Background(), idem.OpMessage)
	if got, _ := ctx.Value(startKey{}).(string); got != "ab" {
		t.Errorf("Start chained the contexts as %q; want %q (each on the one before)", got, "ab")
	}
	if len(a.started) != 1 || a.started[0] != idem.OpMessage || len(b.started) != 1 {
		t.Errorf("started a %v, b %v; want one OpMessage each", a.started, b.started)
	}
}
