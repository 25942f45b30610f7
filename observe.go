package idem

import (
	"context"
	"time"
)

// Op names a store operation in an Event.
type Op uint8

// The operations a store reports to its Observer.
const (
	OpClaim Op = iota + 1
	OpRenew
	OpConfirm
	OpForget
	OpLookup
	OpClaimBatch
	OpConfirmBatch
	// OpRun is SQLStore.Run: Outcome Claimed when the write ran, Duplicate
	// when a committed result was replayed.
	OpRun
)

var opNames = [...]string{"", "claim", "renew", "confirm", "forget", "lookup", "claim_batch", "confirm_batch", "run"}

// String returns the operation's name in snake case, for metric labels.
func (op Op) String() string {
	if int(op) < len(opNames) && op != 0 {
		return opNames[op]
	}
	return "op"
}

// Event describes one store operation. It carries no key: keys may hold
// personal data.
type Event struct {
	Op Op
	// Outcome is Claim's outcome; zero for other operations and on error.
	Outcome Outcome
	// Items is the number of keys a batch operation carried; 1 otherwise.
	Items int
	// Late is set on a Confirm that recorded after its lease was lost.
	Late bool
	// Took is the operation's duration as the caller saw it.
	Took time.Duration
	// Err is the operation's error; nil on success. ErrLeaseLost and
	// ErrNotFound are reported here too.
	Err error
}

// Observer receives one Event per store operation, synchronously on the
// caller's goroutine after the operation ends: it must be quick and safe for
// concurrent use. A nil Observer costs nothing.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// observe reports e to o when there is an observer.
func (o *Options) observe(ctx context.Context, e Event, start time.Time) {
	if o.Observer == nil {
		return
	}
	e.Took = time.Since(start)
	if e.Items == 0 {
		e.Items = 1
	}
	o.Observer.Observe(ctx, e)
}
