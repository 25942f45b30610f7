package lincheck

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// CheckTimeout bounds porcupine's search on one history. Histories of a
// few dozen calls per key take milliseconds; a search that runs out of time
// is reported as inconclusive, never as a pass.
const CheckTimeout = 30 * time.Second

// Check reports whether h is linearizable under Model: porcupine.Ok,
// Illegal, or Unknown when the search ran out of CheckTimeout.
func (h *History) Check() porcupine.CheckResult {
	return porcupine.CheckOperationsTimeout(Model(), h.Ops, CheckTimeout)
}

// Visualize writes porcupine's HTML visualization of h (the longest
// linearizations found for each key, and where they fail) to a new file in
// dir ("" for the system's temporary directory) and returns its path.
func (h *History) Visualize(dir string) (string, error) {
	_, info := porcupine.CheckOperationsVerbose(Model(), h.Ops, CheckTimeout)
	f, err := os.CreateTemp(dir, "idem-lincheck-*.html")
	if err != nil {
		return "", err
	}
	path := f.Name()
	if err := porcupine.Visualize(Model(), info, f); err != nil {
		_ = f.Close()
		return "", err
	}
	return path, f.Close()
}

// Tally counts what a run of histories checked.
type Tally struct {
	Histories    int // histories checked
	Ops          int // calls in them
	Unknown      int // calls whose outcome was unknown
	Violations   int // histories that are not linearizable
	Inconclusive int // histories whose check ran out of time
	Failures     int // calls that failed although their deadline had not run out
}

func (t Tally) String() string {
	return fmt.Sprintf("%d histories, %d operations, %d with unknown outcome, %d violations, %d inconclusive, %d store failures",
		t.Histories, t.Ops, t.Unknown, t.Violations, t.Inconclusive, t.Failures)
}

// Verify runs n histories, history i being workload(i) run with seed+i,
// checks each, and fails t for every history that is not linearizable
// (naming its seed and its visualization), whose check is inconclusive, or
// in which the store failed a call. It returns what it counted.
func Verify(t testing.TB, n int, seed uint64, workload func(i int) Workload) Tally {
	t.Helper()
	var tally Tally
	for i := range n {
		s := seed + uint64(i)
		h := workload(i).Run(s)
		tally.Histories++
		tally.Ops += len(h.Ops)
		tally.Unknown += h.Unknown
		tally.Failures += len(h.Failures)
		for _, err := range h.Failures {
			t.Errorf("history %d (seed %d): the store failed a call: %v", i, s, err)
		}
		switch h.Check() {
		case porcupine.Ok:
		case porcupine.Illegal:
			tally.Violations++
			path, err := h.Visualize("")
			if err != nil {
				path = fmt.Sprintf("(not written: %v)", err)
			}
			t.Errorf("history %d (seed %d, rerun with -idem.seed=%d) is not linearizable: no sequential store keeping the Store contract answers it so; visualization: %s",
				i, s, s, path)
		default:
			tally.Inconclusive++
			t.Errorf("history %d (seed %d): the linearizability check ran out of %v", i, s, CheckTimeout)
		}
		if t.Failed() && tally.Violations+tally.Inconclusive+tally.Failures >= 3 {
			t.Errorf("stopped after %d histories: %v", tally.Histories, tally)
			break
		}
	}
	return tally
}
