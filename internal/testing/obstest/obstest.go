// Package obstest records what an idem.Observer is told, for the tests of
// the packages that report events.
package obstest

import (
	"context"
	"sync"

	"github.com/idemgo/idem"
)

// Log is an idem.Observer that records the events it observes, in order,
// and whether each was observed on a context that Starter.Start began.
type Log struct {
	mu      sync.Mutex
	events  []idem.Event
	inside  []bool
	started []idem.Op
}

// Observe records e.
func (l *Log) Observe(ctx context.Context, e idem.Event) {
	_, inside := StartedOp(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
	l.inside = append(l.inside, inside)
}

// Of returns the recorded events of op.
func (l *Log) Of(op idem.Op) []idem.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []idem.Event
	for _, e := range l.events {
		if e.Op == op {
			out = append(out, e)
		}
	}
	return out
}

// All returns every recorded event and, for each, whether it was observed
// on a started context.
func (l *Log) All() ([]idem.Event, []bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]idem.Event(nil), l.events...), append([]bool(nil), l.inside...)
}

// Reset forgets the recorded events.
func (l *Log) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events, l.inside = nil, nil
}

// Starter is a Log that is also an idem.Starter: it records the ops it
// starts and marks the contexts it returns (see StartedOp).
type Starter struct{ Log }

type startKey struct{}

// Start records op and returns ctx marked with it.
func (s *Starter) Start(ctx context.Context, op idem.Op) context.Context {
	s.mu.Lock()
	s.started = append(s.started, op)
	s.mu.Unlock()
	return context.WithValue(ctx, startKey{}, op)
}

// Started returns the ops started so far, in order.
func (s *Starter) Started() []idem.Op {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]idem.Op(nil), s.started...)
}

// StartedOp returns the op of the Start that began ctx, if one did.
func StartedOp(ctx context.Context) (idem.Op, bool) {
	op, ok := ctx.Value(startKey{}).(idem.Op)
	return op, ok
}
