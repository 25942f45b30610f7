package soak

import (
	"strings"
	"testing"

	"github.com/idemgo/idem"
)

func confirmed(tok int64) *idem.Record { return &idem.Record{Confirmed: true, Token: tok} }

// TestCheck feeds Check hand-made ledgers: each case is a run the soak must
// pass or fail, and says which problem it must report.
func TestCheck(t *testing.T) {
	ids := []string{"a", "b"}
	recs := map[string]*idem.Record{"a": confirmed(10), "b": confirmed(20)}
	killedW1 := func() Evidence {
		ev := NewEvidence()
		ev.Killed["w1"] = true
		return ev
	}
	tests := []struct {
		name        string
		rows        []Row
		recs        map[string]*idem.Record
		ev          Evidence
		exactlyOnce bool
		problem     string // a substring of the one expected problem; "" for none
		crash       int    // CrashLogged + CrashUnlogged
		lease       int
		unrecorded  int
	}{
		{name: "once each", rows: []Row{{"a", 10, "w0"}, {"b", 20, "w0"}}, ev: NewEvidence()},
		{name: "missing", rows: []Row{{"a", 10, "w0"}}, ev: NewEvidence(), problem: "no ledger row"},
		{name: "extra", rows: []Row{{"a", 10, "w0"}, {"b", 20, "w0"}, {"c", 1, "w0"}}, ev: NewEvidence(), problem: "not in the input"},
		{name: "unconfirmed", rows: []Row{{"a", 10, "w0"}, {"b", 20, "w0"}},
			recs: map[string]*idem.Record{"a": confirmed(10), "b": {Token: 20}}, ev: NewEvidence(), problem: "no confirmed record"},
		{name: "transactional duplicate", rows: []Row{{"a", 0, "w0"}, {"a", 0, "w1"}, {"b", 0, "w0"}},
			recs: map[string]*idem.Record{"a": confirmed(1), "b": confirmed(2)}, ev: killedW1(), exactlyOnce: true,
			problem: "more than one ledger row in transactional mode"},
		{name: "crash before confirm", rows: []Row{{"a", 5, "w1"}, {"a", 10, "w0"}, {"b", 20, "w0"}}, ev: killedW1(), crash: 1},
		{name: "duplicate by a live worker", rows: []Row{{"a", 5, "w2"}, {"a", 10, "w0"}, {"b", 20, "w0"}}, ev: killedW1(),
			problem: "explained neither"},
		{name: "killed after reporting the confirmation", rows: []Row{{"a", 5, "w1"}, {"a", 10, "w0"}, {"b", 20, "w0"}},
			ev: func() Evidence {
				ev := killedW1()
				ev.Confirmed[Attempt{"a", 5, "w1"}] = true
				return ev
			}(), problem: "explained neither"},
		{name: "lease trouble", rows: []Row{{"a", 5, "w2"}, {"a", 10, "w0"}, {"b", 20, "w0"}},
			ev: func() Evidence {
				ev := NewEvidence()
				ev.LeaseTrouble[idem.KeyHash("a")] = true
				return ev
			}(), lease: 1},
		{name: "not recorded", rows: []Row{{"a", 10, "w0"}, {"b", 20, "w0"}},
			recs: map[string]*idem.Record{"a": confirmed(10), "b": {Token: 20}},
			ev: func() Evidence {
				ev := NewEvidence()
				ev.Unrecorded[idem.KeyHash("b")] = true
				ev.LeaseTrouble[idem.KeyHash("b")] = true
				return ev
			}(), unrecorded: 1},
		{name: "not recorded, done again after a crash", rows: []Row{{"a", 10, "w0"}, {"b", 20, "w1"}, {"b", 21, "w0"}},
			recs: map[string]*idem.Record{"a": confirmed(10), "b": {Token: 21}},
			ev: func() Evidence {
				ev := killedW1()
				ev.Unrecorded[idem.KeyHash("b")] = true
				ev.LeaseTrouble[idem.KeyHash("b")] = true
				return ev
			}(), unrecorded: 1, crash: 1},
		{name: "confirmed run left no row", rows: []Row{{"a", 5, "w1"}, {"b", 20, "w0"}}, ev: killedW1(),
			problem: "exactly one ledger row under the confirmed token", crash: 1},
		{name: "confirmed run's row twice", rows: []Row{{"a", 10, "w0"}, {"a", 10, "w0"}, {"b", 20, "w0"}}, ev: NewEvidence(),
			problem: "exactly one ledger row under the confirmed token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := recs
			if tc.recs != nil {
				r = tc.recs
			}
			v := Check(ids, tc.rows, r, tc.ev, tc.exactlyOnce)
			switch {
			case tc.problem == "" && len(v.Problems) != 0:
				t.Errorf("Check: problems %q; want none", v.Problems)
			case tc.problem != "" && (len(v.Problems) == 0 || !strings.Contains(strings.Join(v.Problems, "\n"), tc.problem)):
				t.Errorf("Check: problems %q; want one about %q", v.Problems, tc.problem)
			}
			if got := v.CrashLogged + v.CrashUnlogged; got != tc.crash {
				t.Errorf("Check: %d duplicates explained by a crash; want %d", got, tc.crash)
			}
			if v.Unrecorded != tc.unrecorded {
				t.Errorf("Check: %d ids unrecorded; want %d", v.Unrecorded, tc.unrecorded)
			}
			if v.LeaseExplained != tc.lease {
				t.Errorf("Check: %d duplicates explained by lease trouble; want %d", v.LeaseExplained, tc.lease)
			}
		})
	}
}

// TestCheckInterrupted counts the runs a kill cut between the effect and the
// confirmation, whether or not they left a duplicate.
func TestCheckInterrupted(t *testing.T) {
	ev := NewEvidence()
	ev.Killed["w1"] = true
	ev.Effects[Attempt{"a", 5, "w1"}] = true // killed before confirming: interrupted
	ev.Effects[Attempt{"b", 6, "w1"}] = true // confirmed, then killed: not
	ev.Confirmed[Attempt{"b", 6, "w1"}] = true
	ev.Effects[Attempt{"c", 7, "w0"}] = true // never killed: not
	v := Check(nil, nil, nil, ev, false)
	if v.Interrupted != 1 {
		t.Errorf("Check: Interrupted = %d; want 1", v.Interrupted)
	}
}
