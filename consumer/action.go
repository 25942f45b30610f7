package consumer

import (
	"errors"
	"fmt"

	"github.com/idemgo/idem"
)

// Action is what a broker should do with a delivery once the wrapper
// ([Idempotent], or one result of [Batch]) has returned; [ActionFor]
// says which. Every adapter under consumer/ settles by it, each in its
// broker's terms.
type Action uint8

// The actions, one per row of the package documentation's table.
const (
	// Ack: the work is done and recorded, now or by an earlier delivery.
	// Remove the delivery.
	Ack Action = iota + 1
	// Redeliver: nothing is recorded (the handler failed, the key is held
	// by another delivery, the store did not answer, the context ended).
	// Deliver it again later, after a delay, so that a busy key or a
	// failing handler does not spin through the broker.
	Redeliver
	// AckAndAlert: the handler succeeded but its confirmation could not be
	// written (ErrNotRecorded). Remove the delivery and report it at error
	// level: a redelivery would claim the key once the lease runs out and
	// do the work a second time, while acking risks that only if yet
	// another duplicate arrives.
	AckAndAlert
	// DeadLetter: no delivery of it can succeed (an invalid or oversized
	// key, a fingerprint mismatch, a damaged record), or none may until an
	// operator settles its key (quarantined after repeated crashes). Move
	// it where an operator sees it (a dead-letter queue, a poison topic),
	// never ack it as done, never redeliver it.
	DeadLetter
)

var actionNames = [...]string{"", "ack", "redeliver", "ack_and_alert", "dead_letter"}

// String returns the action's name in snake case ("ack", "redeliver",
// "ack_and_alert", "dead_letter"), for logs and metric labels.
func (a Action) String() string {
	if a != 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// ActionFor maps the error a wrapper returned for one delivery to what the
// broker should do with it:
//
//	wrapper's error                                 action
//	nil (done now, or a duplicate)                  Ack
//	matching ErrNotRecorded                         AckAndAlert
//	matching idem.ErrInvalidKey, idem.ErrTooLarge,  DeadLetter
//	  idem.ErrFingerprintMismatch, idem.ErrDamaged,
//	  idem.ErrQuarantined
//	anything else: idem.ErrInProgress, the          Redeliver
//	  handler's error, the store's, the context's
//
// ErrNotRecorded is checked first: the work it reports was done, whatever
// the store's error inside it says.
//
// A quarantined key (its deliveries crashed the handler more times in a
// row than the store's MaxTakeOvers) is dead-lettered, not acked and
// alerted: acking would lose the message, while the work has not been
// recorded as done; once an operator settles the key (idem resolve
// --forget, or --confirm RESULT), the dead letter can be replayed, and it
// runs or is a duplicate. Redelivering it would only be refused again. The error alone decides, so a
// handler's own error matching one of the DeadLetter sentinels (its own
// idem calls failing so) is dead-lettered too: no redelivery would fix it
// either. A handler's panic is not an error: the wrappers re-raise it, and
// the adapters redeliver the delivery.
func ActionFor(err error) Action {
	switch {
	case err == nil:
		return Ack
	case errors.Is(err, ErrNotRecorded):
		return AckAndAlert
	case errors.Is(err, idem.ErrInvalidKey), errors.Is(err, idem.ErrTooLarge),
		errors.Is(err, idem.ErrFingerprintMismatch), errors.Is(err, idem.ErrDamaged),
		errors.Is(err, idem.ErrQuarantined):
		return DeadLetter
	}
	return Redeliver
}
