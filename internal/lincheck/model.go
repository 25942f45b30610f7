// Package lincheck checks that a Store is linearizable: that every history
// of concurrent Claim, Confirm, Forget, Renew, Checkpoint and Lookup calls it answers
// could have been answered by one sequential store keeping the Store
// contract, each call taking effect at one instant between its start and its
// return.
//
// A Workload drives many clients over few keys and records a History; Check
// hands it to the porcupine checker with Model, the sequential contract. A
// call whose outcome is unknown (its context ran out mid-call, or the store
// failed) is modelled as porcupine's etcd model does: it returns "at
// infinity", so the checker may place it anywhere after its start, and the
// model accepts it as applied there — or, placed after every other call, as
// never applied.
//
// Leases in these histories are meant to outlive them: the model has no
// clock, so a lease that expired mid-history would look like a violation;
// and so does any take-over or quarantine a store reports, since no lease
// runs out. A checkpoint belongs to the live claim that recorded it: a
// record read while that claim holds the key must show it.
package lincheck

import (
	"strconv"

	"github.com/anishathalye/porcupine"
	"github.com/idemgo/idem"
)

// Kind names a Store method.
type Kind uint8

// The Store methods a history records.
const (
	Claim Kind = iota + 1
	Confirm
	Forget
	Renew
	Lookup
	// Checkpoint is idem.Checkpointer's.
	Checkpoint
)

// String returns the method's name.
func (k Kind) String() string {
	switch k {
	case Claim:
		return "Claim"
	case Confirm:
		return "Confirm"
	case Forget:
		return "Forget"
	case Renew:
		return "Renew"
	case Lookup:
		return "Lookup"
	case Checkpoint:
		return "Checkpoint"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// LeaseRef is the part of a lease that a store judges it by.
type LeaseRef struct {
	Token       int64
	Owner       string
	Fingerprint string
}

// Input is one call: its method, key and arguments.
type Input struct {
	Kind Kind
	Key  string
	// Worker is the Worker of the store that a Claim went to: the owner
	// its lease must name.
	Worker string
	// Fingerprint is Claim's fingerprint.
	Fingerprint string
	// Lease is the lease given to Confirm, Forget and Renew.
	Lease LeaseRef
	// Result is Confirm's result, or Checkpoint's data.
	Result string
	// Forgot says whether the lease given to Confirm or Renew had been
	// forgotten: a store refuses such a lease locally (ErrLeaseLost, no
	// effect), from the moment its Forget is called.
	Forgot Forgot
}

// Forgot is what a call knew of a Forget of its lease (or of a copy of it).
type Forgot uint8

const (
	// NotForgotten: no Forget of the lease began before the call returned.
	NotForgotten Forgot = iota
	// MaybeForgotten: a Forget began before the call returned, but had not
	// returned when the call began: the call may or may not have seen it.
	// In a batch, an item whose batch holds a lease so forgotten.
	MaybeForgotten
	// Forgotten: a Forget of the lease returned before the call began; the
	// call must be refused. In a batch, an item whose batch holds one.
	Forgotten
)

// Err classifies a call's error.
type Err uint8

// The errors a call can end with.
const (
	// OK: no error.
	OK Err = iota
	// LeaseLost: idem.ErrLeaseLost.
	LeaseLost
	// NotFound: idem.ErrNotFound.
	NotFound
	// Mismatch: idem.ErrFingerprintMismatch, a Claim that found the record
	// (which Output describes) made with another fingerprint.
	Mismatch
	// NotKept: idem.ErrAlreadyConfirmed, a Confirm that found another
	// lease's confirmation.
	NotKept
	// Unknown: any other error, after which the call may or may not have
	// taken effect.
	Unknown
)

var errNames = [...]string{OK: "ok", LeaseLost: "ErrLeaseLost", NotFound: "ErrNotFound",
	Mismatch: "ErrFingerprintMismatch", NotKept: "ErrAlreadyConfirmed", Unknown: "unknown"}

func (e Err) String() string {
	if int(e) < len(errNames) {
		return errNames[e]
	}
	return "Err(" + strconv.Itoa(int(e)) + ")"
}

// Output is what a call answered. For a Claim it describes the lease
// (Claimed) or the record (Duplicate, InProgress); for a Lookup, the record.
// Fingerprints and results are compared as strings: a nil and an empty byte
// slice are the same value, which stores need not tell apart.
type Output struct {
	Err     Err
	Outcome idem.Outcome // Claim
	// Key, Confirmed, Token, Owner, Fingerprint and Result are the lease's
	// or the record's.
	Key         string
	Confirmed   bool
	Token       int64
	Owner       string
	Fingerprint string
	Result      string
	// Checkpoint is a live claim's last checkpoint.
	Checkpoint string
	// Malformed says what was wrong with an answer that no correct store
	// gives (Claimed without a lease, a nil record, a take-over or a
	// quarantine where no lease ran out); the model rejects it.
	Malformed string
}

// phase is what a key's record is.
type phase uint8

const (
	absent phase = iota
	claimed
	confirmed
)

// State is the sequential store's record of one key. It is comparable, so
// porcupine's default equality (==) serves.
type State struct {
	Phase phase
	// Token of the claim or confirmation; 0 while it is unknown: a Claim
	// whose outcome is unknown took effect, and no answer has shown its
	// token yet.
	Token       int64
	Owner       string // holder of a claim
	Fingerprint string
	Result      string // of a confirmation
	Checkpoint  string // of a claim
	// Last is the greatest fencing token any Claim on the key is known to
	// have received: the next Claimed must exceed it.
	Last int64
}

// Model returns the sequential specification of the Store contract for
// porcupine, partitioned by key: a history is linearizable when each key's
// calls are, since no call touches two keys.
func Model() porcupine.Model {
	return porcupine.Model{
		Partition:         partition,
		Init:              func() any { return State{} },
		Step:              func(s, in, out any) (bool, any) { return step(s.(State), in.(Input), out.(Output)) },
		DescribeOperation: func(in, out any) string { return describe(in.(Input), out.(Output)) },
		DescribeState:     func(s any) string { return s.(State).String() },
	}
}

func partition(history []porcupine.Operation) [][]porcupine.Operation {
	index := map[string]int{}
	var parts [][]porcupine.Operation
	for _, op := range history {
		k := op.Input.(Input).Key
		i, ok := index[k]
		if !ok {
			i = len(parts)
			index[k] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], op)
	}
	return parts
}

// holds reports whether l is the key's live claim: the only lease Renew
// and Forget act on.
func (s State) holds(l LeaseRef) bool {
	return s.Phase == claimed && s.Token != 0 && s.Token == l.Token && s.Owner == l.Owner
}

// mayHold reports whether l may be the key's live claim when that claim's
// Claim had an unknown outcome and no answer has shown its token yet: the
// same owner and a token newer than any known. A lease of that owner, with
// the token it was given or one guessed right, then acts on it.
func (s State) mayHold(l LeaseRef) bool {
	return s.Phase == claimed && s.Token == 0 && s.Owner == l.Owner && l.Token > s.Last
}

// step applies one call to s and reports whether out is an answer the
// contract allows there. An unknown outcome is always allowed, and applied:
// the checker covers "not applied" by placing the call after all others.
func step(s State, in Input, out Output) (bool, State) {
	if out.Malformed != "" {
		return false, s
	}
	if in.Kind == Confirm || in.Kind == Renew || in.Kind == Checkpoint {
		// A forgotten lease is refused before any I/O: the caller said the
		// work did not happen, and another holder's claim is never touched.
		switch {
		case in.Forgot == Forgotten:
			// Unknown too: a call cut short after the store refused it.
			return out.Err == LeaseLost || out.Err == Unknown, s
		case in.Forgot == MaybeForgotten && out.Err == LeaseLost:
			return true, s
		}
	}
	if out.Err == Unknown {
		return true, apply(s, in)
	}
	switch in.Kind {
	case Claim:
		return stepClaim(s, in, out)
	case Confirm:
		// Confirm never reports a lost lease: it records the work anyway.
		// It reports another lease's confirmation, which stays.
		want := OK
		if s.Phase == confirmed && s.Token != in.Lease.Token {
			want = NotKept
		}
		return out.Err == want, apply(s, in)
	case Forget, Renew, Checkpoint:
		if s.holds(in.Lease) {
			return out.Err == OK, apply(s, in)
		}
		if out.Err == OK && s.mayHold(in.Lease) {
			// The claim's token was unknown, and this lease turns out to
			// be it: learn it, as reports does from a record.
			s.Token, s.Last = in.Lease.Token, in.Lease.Token
			return true, apply(s, in)
		}
		return out.Err == LeaseLost, s
	case Lookup:
		if s.Phase == absent {
			return out.Err == NotFound, s
		}
		if out.Err != OK {
			return false, s
		}
		return reports(s, in.Key, out)
	}
	return false, s
}

// apply is the effect of a call that succeeded (or may have).
func apply(s State, in Input) State {
	switch in.Kind {
	case Claim:
		if s.Phase == absent {
			return State{Phase: claimed, Owner: in.Worker, Fingerprint: in.Fingerprint, Last: s.Last}
		}
	case Confirm:
		// The first confirmation stays; anything else, a live claim by
		// another lease included, gives way to the work that was done.
		if s.Phase != confirmed {
			return State{Phase: confirmed, Token: in.Lease.Token, Fingerprint: in.Lease.Fingerprint,
				Result: in.Result, Last: max(s.Last, in.Lease.Token)}
		}
	case Forget:
		if s.holds(in.Lease) {
			return State{Last: s.Last}
		}
	case Checkpoint:
		if s.holds(in.Lease) || s.mayHold(in.Lease) {
			s.Checkpoint = in.Result
		}
	}
	return s
}

func stepClaim(s State, in Input, out Output) (bool, State) {
	want := OK
	if s.Phase != absent && in.Fingerprint != "" && s.Fingerprint != "" && in.Fingerprint != s.Fingerprint {
		want = Mismatch
	}
	if out.Err != want {
		return false, s
	}
	switch s.Phase {
	case absent:
		ok := out.Outcome == idem.Claimed && out.Key == in.Key && !out.Confirmed &&
			out.Token > s.Last && out.Owner == in.Worker && out.Fingerprint == in.Fingerprint
		return ok, State{Phase: claimed, Token: out.Token, Owner: in.Worker, Fingerprint: in.Fingerprint, Last: out.Token}
	case claimed:
		if out.Outcome != idem.InProgress {
			return false, s
		}
	case confirmed:
		if out.Outcome != idem.Duplicate {
			return false, s
		}
	}
	return reports(s, in.Key, out)
}

// reports checks a record (from Lookup, Duplicate or InProgress) against s,
// learning the token of a claim whose Claim's answer was lost.
func reports(s State, key string, out Output) (bool, State) {
	if out.Key != key || out.Confirmed != (s.Phase == confirmed) || out.Fingerprint != s.Fingerprint {
		return false, s
	}
	switch s.Phase {
	case claimed:
		if out.Owner != s.Owner || out.Result != "" || out.Checkpoint != s.Checkpoint {
			return false, s
		}
		if s.Token == 0 {
			if out.Token <= s.Last {
				return false, s
			}
			s.Token, s.Last = out.Token, out.Token
			return true, s
		}
	case confirmed:
		if out.Owner != "" || out.Result != s.Result || out.Checkpoint != "" {
			return false, s
		}
	}
	return out.Token == s.Token, s
}
