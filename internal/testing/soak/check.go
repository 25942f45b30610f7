package soak

import (
	"fmt"
	"sort"
	"strings"

	"github.com/idemgo/idem"
)

// Row is one entry of the ledger: the effect of one handler run.
type Row struct {
	ID     string // the message id
	Token  int64  // the fencing token of the lease the effect ran under (0 in SQL mode)
	Worker string // the worker process that wrote it
}

// Attempt names one handler run: a message, the lease it ran under and the
// worker that ran it.
type Attempt struct {
	ID     string
	Token  int64
	Worker string
}

// Evidence is what the workers told the broker, and what the broker did to
// them, before and while they died. The workers write each line with one
// write(2) on a pipe, so a line written before a SIGKILL is still read.
type Evidence struct {
	// Killed holds the workers the broker SIGKILLed.
	Killed map[string]bool
	// Effects holds the runs that logged "effect done" (after the effect,
	// before the wrapper confirmed it).
	Effects map[Attempt]bool
	// Confirmed holds the runs whose wrapper returned success after
	// recording the work.
	Confirmed map[Attempt]bool
	// LeaseTrouble holds the idem.KeyHash of every key for which a worker
	// reported a lost lease, a late confirmation, a failed confirmation, a
	// confirmation that lost to another's, or ErrNotRecorded: the documented
	// ways, other than a crash, in which lease mode may do a message's work
	// twice.
	LeaseTrouble map[string]bool
	// Unrecorded holds the idem.KeyHash of every key for which a wrapper
	// returned consumer.ErrNotRecorded: the work was done and acked, but no
	// Confirm succeeded, so the store may have no record of it.
	Unrecorded map[string]bool
}

// NewEvidence returns empty Evidence, ready to be filled.
func NewEvidence() Evidence {
	return Evidence{Killed: map[string]bool{}, Effects: map[Attempt]bool{},
		Confirmed: map[Attempt]bool{}, LeaseTrouble: map[string]bool{}, Unrecorded: map[string]bool{}}
}

// Verdict is the outcome of checking a ledger against the input set.
type Verdict struct {
	// Rows is the number of ledger rows; Duplicates the rows beyond the first
	// of each message id.
	Rows, Duplicates int
	// CrashLogged and CrashUnlogged are duplicates written by a worker that
	// was killed before its wrapper reported the work confirmed: the crash
	// fell between the effect and the confirmation. Logged ones had written
	// "effect done" first; unlogged ones were killed before that line, mostly
	// while the effect's command was in flight (Redis had done it, the reply
	// had not arrived).
	CrashLogged, CrashUnlogged int
	// LeaseExplained are duplicates of a key for which a worker reported lease
	// trouble (lost lease, late or failed confirmation).
	LeaseExplained int
	// Unexplained are duplicates with neither explanation.
	Unexplained int
	// Unrecorded counts ids without a confirmed record for which a wrapper
	// reported ErrNotRecorded (lease mode: documented, not a problem).
	Unrecorded int
	// Interrupted counts runs that logged "effect done" on a worker that was
	// then killed before reporting them confirmed: kills that fell between the
	// effect and the confirmation (whether or not the store had recorded it).
	Interrupted int
	// Problems lists every violated check, in words; empty means the run
	// passed.
	Problems []string
}

// maxExamples bounds the ids quoted per problem.
const maxExamples = 5

// Check compares the ledger rows with the input ids and the store's records
// (records[id] as Lookup returned it; nil when Lookup found nothing).
//
// Both modes: every input id has a row and no row names an id outside the
// input. Transactional mode (exactlyOnce): every id has a confirmed record
// and exactly one row. Lease mode: every id has a confirmed record, unless a
// wrapper reported ErrNotRecorded for it (the work was done and acked, the
// Confirm never got through); exactly one row carries the token of the
// confirmed record (the run that recorded the work did it); and every other
// row is explained by a kill of its writer before its confirmation, or by
// reported lease trouble for that key. Anything else is a problem.
func Check(ids []string, rows []Row, records map[string]*idem.Record, ev Evidence, exactlyOnce bool) Verdict {
	var v Verdict
	v.Rows = len(rows)
	byID := make(map[string][]Row, len(ids))
	for _, r := range rows {
		byID[r.ID] = append(byID[r.ID], r)
	}
	input := make(map[string]bool, len(ids))
	var missing, unconfirmed, dup, badToken, unexplained []string
	for _, id := range ids {
		input[id] = true
		rs := byID[id]
		if len(rs) == 0 {
			missing = append(missing, id)
		}
		rec := records[id]
		done := rec != nil && rec.Confirmed
		if !done {
			if exactlyOnce || !ev.Unrecorded[idem.KeyHash(id)] {
				unconfirmed = append(unconfirmed, id)
			} else {
				v.Unrecorded++
			}
		}
		if len(rs) > 1 {
			v.Duplicates += len(rs) - 1
			dup = append(dup, fmt.Sprintf("%s×%d", id, len(rs)))
		}
		if exactlyOnce || len(rs) == 0 {
			continue
		}
		// The row of the run that recorded the work needs no explanation;
		// without a record (ErrNotRecorded), that of the last run.
		var keep int64
		if done {
			keep = rec.Token
		} else {
			for _, r := range rs {
				keep = max(keep, r.Token)
			}
		}
		kept := 0
		for _, r := range rs {
			if r.Token == keep {
				kept++
			}
		}
		if done && kept != 1 {
			badToken = append(badToken, fmt.Sprintf("%s (confirmed token %d in %d rows)", id, rec.Token, kept))
		}
		skipped := false
		for _, r := range rs {
			if r.Token == keep && !skipped {
				skipped = true
				continue
			}
			a := Attempt(r)
			switch {
			case ev.Killed[r.Worker] && !ev.Confirmed[a] && ev.Effects[a]:
				v.CrashLogged++
			case ev.Killed[r.Worker] && !ev.Confirmed[a]:
				v.CrashUnlogged++
			case ev.LeaseTrouble[idem.KeyHash(id)]:
				v.LeaseExplained++
			default:
				v.Unexplained++
				unexplained = append(unexplained, fmt.Sprintf("%s token %d by %s", id, r.Token, r.Worker))
			}
		}
	}
	var extra []string
	for id := range byID {
		if !input[id] {
			extra = append(extra, id)
		}
	}
	for a := range ev.Effects {
		if ev.Killed[a.Worker] && !ev.Confirmed[a] {
			v.Interrupted++
		}
	}
	v.problem(missing, "input ids have no ledger row (work lost)")
	v.problem(extra, "ledger ids are not in the input")
	v.problem(unconfirmed, "input ids have no confirmed record in the store")
	if exactlyOnce {
		v.problem(dup, "ids have more than one ledger row in transactional mode")
	}
	v.problem(badToken, "ids do not have exactly one ledger row under the confirmed token")
	v.problem(unexplained, "duplicate ledger rows are explained neither by a crash nor by lease trouble")
	return v
}

func (v *Verdict) problem(ids []string, what string) {
	if len(ids) == 0 {
		return
	}
	sort.Strings(ids)
	ex := ids[:min(len(ids), maxExamples)]
	v.Problems = append(v.Problems, fmt.Sprintf("%d %s, e.g. %s", len(ids), what, strings.Join(ex, ", ")))
}
