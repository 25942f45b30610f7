package lincheck

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemgo/idem"
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

// MaxFailures is the share of calls that may fail for reasons outside the
// store's logic (a connection refused or timed out on a loaded machine)
// before Verify fails the test: such calls are checked as unknown outcomes,
// but a store that fails often is not being tested.
const MaxFailures = 0.01

// logicErrors are errors a store returns only when its logic or its data is
// wrong, never because a server was slow: a history with one fails.
var logicErrors = []error{idem.ErrDamaged, idem.ErrInvalidKey, idem.ErrTooLarge, idem.ErrInvalidLease}

func (t Tally) String() string {
	return fmt.Sprintf("%d histories, %d operations, %d with unknown outcome, %d violations, %d inconclusive, %d store failures",
		t.Histories, t.Ops, t.Unknown, t.Violations, t.Inconclusive, t.Failures)
}

// TB is what Verify needs of a *testing.T, so that a program can run it
// without package testing (storetest.Check does).
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
	Failed() bool
}

// Verify runs n histories, history i being workload(i) run with seed+i,
// checks each, and fails t for every history that is not linearizable
// (naming its seed, the flag seedFlag that reruns it, and its
// visualization) or whose check is inconclusive.
// It also fails t when a call failed with an error of the store's logic
// (ErrDamaged, say), or when more than MaxFailures of the calls failed at
// all. It returns what it counted.
func Verify(t TB, n int, seed uint64, seedFlag string, workload func(i int) Workload) Tally {
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
			if slices.ContainsFunc(logicErrors, func(e error) bool { return errors.Is(err, e) }) {
				t.Errorf("history %d (seed %d): the store failed a call: %v", i, s, err)
			} else if tally.Failures <= 3 {
				t.Logf("history %d (seed %d): a call failed (checked as an unknown outcome): %v", i, s, err)
			}
		}
		switch h.Check() {
		case porcupine.Ok:
		case porcupine.Illegal:
			tally.Violations++
			path, err := h.Visualize("")
			if err != nil {
				path = fmt.Sprintf("(not written: %v)", err)
			}
			t.Errorf("history %d (seed %d, rerun with -%s=%d) is not linearizable: no sequential store keeping the Store contract answers it so; the calls and their answers are drawn in %s",
				i, s, seedFlag, s, path)
		default:
			tally.Inconclusive++
			t.Errorf("history %d (seed %d): the linearizability check ran out of %v", i, s, CheckTimeout)
		}
		if t.Failed() && tally.Violations+tally.Inconclusive >= 3 {
			t.Errorf("stopped after %d histories: %v", tally.Histories, tally)
			break
		}
	}
	if float64(tally.Failures) > MaxFailures*float64(tally.Ops) {
		t.Errorf("%d of %d calls failed although their deadline had not run out; want at most %.0f%%",
			tally.Failures, tally.Ops, 100*MaxFailures)
	}
	return tally
}
