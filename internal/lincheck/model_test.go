package lincheck

import (
	"math"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/idemgo/idem"
)

// seq builds a history from calls given as (start, end) pairs; end 0 means
// the outcome is unknown (it returns at infinity).
type seq []porcupine.Operation

func (s seq) add(call, ret int64, in Input, out Output) seq {
	if ret == 0 {
		ret = math.MaxInt64
		out.Err = Unknown
	}
	if in.Key == "" {
		in.Key = "k"
	}
	return append(s, porcupine.Operation{ClientId: len(s), Input: in, Call: call, Output: out, Return: ret})
}

func claimIn(worker, fp string) Input { return Input{Kind: Claim, Worker: worker, Fingerprint: fp} }

func claimedOut(token int64, owner, fp string) Output {
	return Output{Outcome: idem.Claimed, Key: "k", Token: token, Owner: owner, Fingerprint: fp}
}

func leaseIn(k Kind, token int64, owner, fp string) Input {
	return Input{Kind: k, Lease: LeaseRef{Token: token, Owner: owner, Fingerprint: fp}}
}

func confirmIn(token int64, owner, fp, result string) Input {
	in := leaseIn(Confirm, token, owner, fp)
	in.Result = result
	return in
}

var lookupIn = Input{Kind: Lookup}

func checkpointIn(token int64, owner, data string) Input {
	in := leaseIn(Checkpoint, token, owner, "f")
	in.Result = data
	return in
}

// checkpointed is o, a record, showing checkpoint cp.
func checkpointed(o Output, cp string) Output {
	o.Checkpoint = cp
	return o
}

// forgotten is in made with a lease whose Forget is f to it.
func forgotten(in Input, f Forgot) Input {
	in.Forgot = f
	return in
}

func claimRec(token int64, owner, fp string) Output {
	return Output{Key: "k", Token: token, Owner: owner, Fingerprint: fp}
}

func doneRec(token int64, fp, result string) Output {
	return Output{Key: "k", Confirmed: true, Token: token, Fingerprint: fp, Result: result}
}

func outcome(o Output, c idem.Outcome) Output {
	o.Outcome = c
	return o
}

// mismatched is Claim's answer of a record made with another fingerprint.
func mismatched(o Output) Output {
	o.Err = Mismatch
	return o
}

var (
	ok       = Output{}
	lost     = Output{Err: LeaseLost}
	notFound = Output{Err: NotFound}
	notKept  = Output{Err: NotKept}
)

func TestModel(t *testing.T) {
	cases := []struct {
		name string
		h    seq
		want bool
	}{
		{"claim, lookup, confirm, duplicate, forget after confirm", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, lookupIn, claimRec(5, "a", "f")).
			add(4, 5, claimIn("b", "f"), outcome(claimRec(5, "a", "f"), idem.InProgress)).
			add(6, 7, leaseIn(Renew, 5, "a", "f"), ok).
			add(8, 9, confirmIn(5, "a", "f", "r"), ok).
			add(10, 11, claimIn("b", "f"), outcome(doneRec(5, "f", "r"), idem.Duplicate)).
			add(12, 13, leaseIn(Forget, 5, "a", "f"), lost).
			add(14, 15, leaseIn(Renew, 5, "a", "f"), lost).
			add(16, 17, lookupIn, doneRec(5, "f", "r")), true},
		{"lookup of a fresh key is NotFound", seq{}.add(0, 1, lookupIn, notFound), true},
		{"a holder's checkpoint shows in the record, a stale lease's is refused", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, checkpointIn(5, "a", "step 1"), ok).
			add(4, 5, checkpointIn(4, "a", "stale"), lost).
			add(6, 7, lookupIn, checkpointed(claimRec(5, "a", "f"), "step 1")).
			add(8, 9, claimIn("b", "f"), outcome(checkpointed(claimRec(5, "a", "f"), "step 1"), idem.InProgress)), true},
		{"a record shows a checkpoint never recorded", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, lookupIn, checkpointed(claimRec(5, "a", "f"), "step 1")), false},
		{"a stale lease's checkpoint accepted", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, checkpointIn(4, "a", "stale"), ok), false},
		{"a forgotten lease's checkpoint accepted", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, forgotten(checkpointIn(5, "a", "late"), Forgotten), ok), false},
		{"a checkpoint survives no confirmation", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, checkpointIn(5, "a", "step 1"), ok).
			add(4, 5, confirmIn(5, "a", "f", "r"), ok).
			add(6, 7, lookupIn, checkpointed(doneRec(5, "f", "r"), "step 1")), false},
		{"lookup of a fresh key finds a record", seq{}.add(0, 1, lookupIn, claimRec(1, "a", "")), false},
		{"two overlapping claims, both Claimed", seq{}.
			add(0, 10, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(1, 11, claimIn("b", "f"), claimedOut(6, "b", "f")), false},
		{"two overlapping claims, one Claimed", seq{}.
			add(0, 10, claimIn("a", "f"), mismatched(outcome(claimRec(6, "b", "g"), idem.InProgress))).
			add(1, 11, claimIn("b", "g"), claimedOut(6, "b", "g")), true},
		{"a claim with another fingerprint answered without the mismatch", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, claimIn("b", "g"), outcome(claimRec(5, "a", "f"), idem.InProgress)), false},
		{"a claim with the same fingerprint answered a mismatch", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, claimIn("b", "f"), mismatched(outcome(claimRec(5, "a", "f"), idem.InProgress))), false},
		{"an empty fingerprint on either side is not compared", seq{}.
			add(0, 1, claimIn("a", ""), claimedOut(5, "a", "")).
			add(2, 3, claimIn("b", "g"), outcome(claimRec(5, "a", ""), idem.InProgress)).
			add(4, 5, confirmIn(5, "a", "", "r"), ok).
			add(6, 7, claimIn("b", "g"), outcome(doneRec(5, "", "r"), idem.Duplicate)), true},
		{"a confirmation's fingerprint mismatched", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, confirmIn(5, "a", "f", "r"), ok).
			add(4, 5, claimIn("b", "g"), mismatched(outcome(doneRec(5, "f", "r"), idem.Duplicate))), true},
		{"claim of a fresh key answered InProgress by no one", seq{}.
			add(0, 1, claimIn("a", "f"), outcome(claimRec(6, "b", "g"), idem.InProgress)), false},
		{"lease names another owner than the claiming worker", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "b", "f")), false},
		{"lease drops the fingerprint", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "")), false},
		{"record drops the fingerprint", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, lookupIn, claimRec(5, "a", "")), false},
		{"token repeats after a forget", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, leaseIn(Forget, 5, "a", "f"), ok).
			add(4, 5, claimIn("a", "f"), claimedOut(5, "a", "f")), false},
		{"token grows after a forget", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, leaseIn(Forget, 5, "a", "f"), ok).
			add(4, 5, lookupIn, notFound).
			add(6, 7, claimIn("b", "f"), claimedOut(9, "b", "f")), true},
		{"forget of another owner's claim succeeds", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, leaseIn(Forget, 5, "b", "f"), ok), false},
		{"forget of another token's claim succeeds", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, leaseIn(Forget, 4, "a", "f"), ok), false},
		{"forget of one's own claim is lost", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, leaseIn(Forget, 5, "a", "f"), lost), false},
		{"forget deletes a confirmation", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, confirmIn(5, "a", "f", "r"), ok).
			add(4, 5, leaseIn(Forget, 5, "a", "f"), ok), false},
		{"renew of another holder's lease succeeds", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, leaseIn(Renew, 5, "b", "f"), ok), false},
		{"renew after a forget succeeds", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, leaseIn(Forget, 5, "a", "f"), ok).
			add(4, 5, leaseIn(Renew, 5, "a", "f"), ok), false},
		{"confirm reports a lost lease", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, confirmIn(4, "a", "f", "r"), lost), false},
		{"a lost lease's confirm replaces the holder's claim", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, confirmIn(3, "z", "old", "r"), ok).
			add(4, 5, lookupIn, doneRec(3, "old", "r")).
			add(6, 7, leaseIn(Renew, 5, "a", "f"), lost), true},
		{"a lost lease's confirm is not recorded", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, confirmIn(3, "z", "old", "r"), ok).
			add(4, 5, lookupIn, claimRec(5, "a", "f")), false},
		{"a confirm after a forget is recorded", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, leaseIn(Forget, 5, "a", "f"), ok).
			add(4, 5, confirmIn(5, "a", "f", "r"), ok).
			add(6, 7, claimIn("b", "f"), outcome(doneRec(5, "f", "r"), idem.Duplicate)), true},
		{"the second confirmation replaces the first", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, confirmIn(5, "a", "f", "r1"), ok).
			add(4, 5, confirmIn(5, "a", "f", "r2"), ok).
			add(6, 7, lookupIn, doneRec(5, "f", "r2")), false},
		{"overlapping confirmations: either may be first, the other is not kept", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 5, confirmIn(5, "a", "f", "r1"), notKept).
			add(3, 6, confirmIn(4, "b", "g", "r2"), ok).
			add(7, 8, lookupIn, doneRec(4, "g", "r2")), true},
		{"overlapping confirmations: both told they were kept", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 5, confirmIn(5, "a", "f", "r1"), ok).
			add(3, 6, confirmIn(4, "b", "g", "r2"), ok).
			add(7, 8, lookupIn, doneRec(4, "g", "r2")), false},
		{"a repeated confirm of the kept lease is not ErrAlreadyConfirmed", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, confirmIn(5, "a", "f", "r"), ok).
			add(4, 5, confirmIn(5, "a", "f", "r"), notKept), false},
		{"duplicate with another result than the confirmation's", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, confirmIn(5, "a", "f", "r"), ok).
			add(4, 5, claimIn("a", "f"), outcome(doneRec(5, "f", "x"), idem.Duplicate)), false},
		{"confirmation names an owner", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, confirmIn(5, "a", "f", "r"), ok).
			add(4, 5, lookupIn, Output{Key: "k", Confirmed: true, Token: 5, Owner: "a", Fingerprint: "f", Result: "r"}), false},
		{"claimed again while confirmed", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, confirmIn(5, "a", "f", "r"), ok).
			add(4, 5, claimIn("a", "f"), claimedOut(6, "a", "f")), false},
		{"unknown claim, not applied", seq{}.
			add(0, 0, claimIn("a", "f"), Output{}).
			add(2, 3, lookupIn, notFound).
			add(4, 5, claimIn("b", "g"), claimedOut(7, "b", "g")), true},
		{"unknown claim, applied: its token shows", seq{}.
			add(0, 0, claimIn("a", "f"), Output{}).
			add(2, 3, lookupIn, claimRec(7, "a", "f")).
			add(4, 5, claimIn("b", "g"), mismatched(outcome(claimRec(7, "a", "f"), idem.InProgress))).
			add(6, 7, leaseIn(Forget, 7, "a", "f"), ok).
			add(8, 9, claimIn("b", "g"), claimedOut(8, "b", "g")), true},
		{"unknown claim, applied: its token changes", seq{}.
			add(0, 0, claimIn("a", "f"), Output{}).
			add(2, 3, lookupIn, claimRec(7, "a", "f")).
			add(4, 5, lookupIn, claimRec(8, "a", "f")), false},
		{"unknown claim, applied: a later claim's token must exceed it", seq{}.
			add(0, 0, claimIn("a", "f"), Output{}).
			add(2, 3, lookupIn, claimRec(7, "a", "f")).
			add(4, 5, leaseIn(Forget, 7, "a", "f"), ok).
			add(6, 7, claimIn("b", "g"), claimedOut(6, "b", "g")), false},
		{"unknown claim after a forget shows an older token", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, leaseIn(Forget, 5, "a", "f"), ok).
			add(4, 0, claimIn("b", "g"), Output{}).
			add(6, 7, lookupIn, claimRec(4, "b", "g")), false},
		{"unknown claim, applied: its holder's lease renews it, then forgets it", seq{}.
			add(0, 0, claimIn("a", "f"), Output{}).
			add(2, 3, leaseIn(Renew, 7, "a", "f"), ok).
			add(4, 5, lookupIn, claimRec(7, "a", "f")).
			add(6, 7, leaseIn(Forget, 7, "a", "f"), ok).
			add(8, 9, lookupIn, notFound), true},
		{"unknown claim: another owner's lease forgets it", seq{}.
			add(0, 0, claimIn("a", "f"), Output{}).
			add(2, 3, leaseIn(Forget, 7, "b", "f"), ok), false},
		{"unknown claim: a lease older than a known token forgets it", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, leaseIn(Forget, 5, "a", "f"), ok).
			add(4, 0, claimIn("a", "f"), Output{}).
			add(6, 7, leaseIn(Forget, 4, "a", "f"), ok), false},
		{"unknown claim: its lease acts, then the token changes", seq{}.
			add(0, 0, claimIn("a", "f"), Output{}).
			add(2, 3, leaseIn(Renew, 7, "a", "f"), ok).
			add(4, 5, lookupIn, claimRec(8, "a", "f")), false},
		{"unknown claim cannot take effect before its start", seq{}.
			add(0, 1, lookupIn, claimRec(7, "a", "f")).
			add(2, 0, claimIn("a", "f"), Output{}), false},
		{"unknown claim seen by its own worker's name, not another's", seq{}.
			add(0, 0, claimIn("a", "f"), Output{}).
			add(2, 3, lookupIn, claimRec(7, "b", "f")), false},
		{"unknown forget: the claim is there, then gone", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 0, leaseIn(Forget, 5, "a", "f"), Output{}).
			add(4, 5, lookupIn, claimRec(5, "a", "f")).
			add(6, 7, lookupIn, notFound), true},
		{"unknown forget: the claim is gone, then back", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 0, leaseIn(Forget, 5, "a", "f"), Output{}).
			add(4, 5, lookupIn, notFound).
			add(6, 7, lookupIn, claimRec(5, "a", "f")), false},
		{"unknown confirm, applied", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 0, confirmIn(5, "a", "f", "r"), Output{}).
			add(4, 5, leaseIn(Renew, 5, "a", "f"), lost).
			add(6, 7, lookupIn, doneRec(5, "f", "r")), true},
		{"unknown confirm with another result", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 0, confirmIn(5, "a", "f", "r"), Output{}).
			add(6, 7, lookupIn, doneRec(5, "f", "s")), false},
		{"confirm after its own forget overwrites the next holder", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, leaseIn(Forget, 5, "a", "f"), ok).
			add(4, 5, claimIn("b", "f"), claimedOut(6, "b", "f")).
			add(6, 7, forgotten(confirmIn(5, "a", "f", "r"), Forgotten), ok), false},
		{"confirm after its own forget refused", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, leaseIn(Forget, 5, "a", "f"), ok).
			add(4, 5, claimIn("b", "f"), claimedOut(6, "b", "f")).
			add(6, 7, forgotten(confirmIn(5, "a", "f", "r"), Forgotten), lost).
			add(8, 9, leaseIn(Renew, 6, "b", "f"), ok), true},
		{"confirm racing its own forget may go either way", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 6, leaseIn(Forget, 5, "a", "f"), lost).
			add(3, 5, forgotten(confirmIn(5, "a", "f", "r"), MaybeForgotten), ok).
			add(7, 8, lookupIn, doneRec(5, "f", "r")), true},
		{"malformed answer", seq{}.add(0, 1, claimIn("a", "f"), Output{Malformed: "Claimed without a lease"}), false},
		{"keys are checked apart", seq{}.
			add(0, 10, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(1, 11, Input{Kind: Claim, Key: "other", Worker: "b", Fingerprint: "f"},
				Output{Outcome: idem.Claimed, Key: "other", Token: 6, Owner: "b", Fingerprint: "f"}), true},
		{"record of another key", seq{}.
			add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
			add(2, 3, Input{Kind: Lookup, Key: "other"}, claimRec(5, "a", "f")), false},
	}
	for _, c := range cases {
		got := porcupine.CheckOperations(Model(), c.h)
		if got != c.want {
			t.Errorf("%s: linearizable = %t; want %t", c.name, got, c.want)
		}
	}
}

func TestDescribe(t *testing.T) {
	h := seq{}.
		add(0, 1, claimIn("a", "f"), claimedOut(5, "a", "f")).
		add(2, 3, lookupIn, claimRec(6, "a", "f"))
	path, err := (&History{Ops: h}).Visualize(t.TempDir())
	if err != nil {
		t.Fatalf("Visualize = %v", err)
	}
	if path == "" {
		t.Fatalf("Visualize wrote no file")
	}
	m := Model()
	got := m.DescribeOperation(h[1].Input, h[1].Output)
	want := `Lookup("k") -> record(confirmed false, token 6, owner "a", fp "f", result "")`
	if got != want {
		t.Errorf("DescribeOperation = %s; want %s", got, want)
	}
	if s := m.DescribeState(State{Phase: claimed, Owner: "a", Last: 4}); s != `claimed(token ?, owner a, fp ""; last 4)` {
		t.Errorf("DescribeState of a claim of unknown token = %s", s)
	}
}

// No lease runs out in a history: a take-over or a quarantine reported in
// one is a violation, never an answer the model accepts.
func TestClaimOutputRefusesCrashAnswers(t *testing.T) {
	l := &idem.Lease{Key: "k", Token: 5, Owner: "a"}
	for name, c := range map[string]struct {
		c   idem.Claim
		err error
	}{
		"take-over":  {idem.Claim{Outcome: idem.Claimed, Lease: l, TakeOver: true, TakeOvers: 1}, nil},
		"checkpoint": {idem.Claim{Outcome: idem.Claimed, Lease: l, Checkpoint: []byte("x")}, nil},
		"quarantine": {idem.Claim{Record: &idem.Record{Key: "k", Quarantined: true}}, idem.ErrQuarantined},
	} {
		if o := claimOutput(c.c, c.err); o.Malformed == "" {
			t.Errorf("claimOutput(%s) = %v; want malformed", name, o)
		}
	}
	if o := recordOutput(&idem.Record{Key: "k", Quarantined: true}); o.Malformed == "" {
		t.Errorf("recordOutput(quarantined) = %v; want malformed", o)
	}
}
