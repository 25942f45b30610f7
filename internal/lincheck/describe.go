package lincheck

// How a history reads when a check fails: the strings of a call (its input
// and output) and of the model's state, which porcupine prints and draws in
// its visualization.

import (
	"fmt"
	"strconv"

	"github.com/idemgo/idem"
)

// String describes f after a call, as describe prints it: nothing when
// the lease was not forgotten.
func (f Forgot) String() string {
	switch f {
	case MaybeForgotten:
		return " (its Forget in flight)"
	case Forgotten:
		return " (after its Forget)"
	}
	return ""
}

// String describes the state for porcupine's visualization.
func (s State) String() string {
	tok := strconv.FormatInt(s.Token, 10)
	if s.Token == 0 {
		tok = "?"
	}
	switch s.Phase {
	case claimed:
		cp := ""
		if s.Checkpoint != "" {
			cp = fmt.Sprintf(", checkpoint %q", s.Checkpoint)
		}
		return fmt.Sprintf("claimed(token %s, owner %s, fp %q%s; last %d)", tok, s.Owner, s.Fingerprint, cp, s.Last)
	case confirmed:
		return fmt.Sprintf("confirmed(token %s, fp %q, result %q; last %d)", tok, s.Fingerprint, s.Result, s.Last)
	}
	return fmt.Sprintf("absent(last %d)", s.Last)
}

func describe(in Input, out Output) string {
	var call string
	switch in.Kind {
	case Claim:
		call = fmt.Sprintf("Claim(%q, fp %q) by %s", in.Key, in.Fingerprint, in.Worker)
	case Confirm:
		call = fmt.Sprintf("Confirm(%q, %s, %q)%s", in.Key, in.Lease, in.Result, in.Forgot)
	case Forget, Renew:
		call = fmt.Sprintf("%v(%q, %s)%s", in.Kind, in.Key, in.Lease, in.Forgot)
	case Checkpoint:
		call = fmt.Sprintf("Checkpoint(%q, %s, %q)%s", in.Key, in.Lease, in.Result, in.Forgot)
	default:
		call = fmt.Sprintf("%v(%q)", in.Kind, in.Key)
	}
	return call + " -> " + out.String()
}

func (l LeaseRef) String() string {
	return fmt.Sprintf("lease(token %d, owner %s, fp %q)", l.Token, l.Owner, l.Fingerprint)
}

// String describes the answer for porcupine's visualization.
func (o Output) String() string {
	switch {
	case o.Malformed != "":
		return "malformed: " + o.Malformed
	case o.Err != OK:
		return o.Err.String()
	case o.Outcome == idem.Claimed:
		return fmt.Sprintf("claimed(token %d, owner %s, fp %q)", o.Token, o.Owner, o.Fingerprint)
	case o.Outcome == 0 && o.Key == "":
		return "ok"
	}
	what := "record"
	if o.Outcome != 0 {
		what = o.Outcome.String()
	}
	cp := ""
	if o.Checkpoint != "" {
		cp = fmt.Sprintf(", checkpoint %q", o.Checkpoint)
	}
	return fmt.Sprintf("%s(confirmed %t, token %d, owner %q, fp %q, result %q%s)",
		what, o.Confirmed, o.Token, o.Owner, o.Fingerprint, o.Result, cp)
}
