package storetest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
)

// Result is the verdict of one check of the suite, as Check returns it.
type Result struct {
	// Name is the check's name, as Run names its subtest: "Claim/Fresh".
	Name string
	// Failed reports that the store broke the rule the check is about,
	// or that the check could not run (the backend failed to open).
	Failed bool
	// Skipped reports a check that does not apply to the backend (a
	// Backend field it needs is nil); Output says why. A check neither
	// failed nor skipped passed.
	Skipped bool
	// Output is what the check said, in order: each violation, with what
	// was expected and why it matters, and its log lines.
	Output []string
	// Elapsed is how long the check took.
	Elapsed time.Duration
}

// Check runs the suite as Run does, but without package testing: for a
// program that certifies a backend, such as `idem check`, where there is
// no *testing.T. newBackend is called once per check, with the check's
// name, and must return a backend whose records no other check sees, as
// Run's must; its error fails that check. The checks run in parallel, at
// most GOMAXPROCS at once (as `go test` runs Run's subtests), each with a
// context that ctx's cancellation cancels; a check still waiting to start
// when ctx is done fails, with ctx's error, without running.
//
// It returns one Result per check, in the suite's order: the checks Run
// runs, Linearizable with as many histories as -storetest.histories says
// (10 unless the program parsed that flag). A check that fails a rule
// goes on or stops as under Run (Errorf or Fatalf); a check that panics
// fails with the panic's value.
func Check(ctx context.Context, newBackend func(check string) (Backend, error)) []Result {
	results := make([]Result, len(checks))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, c := range checks {
		results[i].Name = c.name
		// ctx is asked after a slot is won too: when both are ready,
		// select picks either.
		acquired := false
		select {
		case sem <- struct{}{}:
			acquired = true
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			if acquired {
				<-sem
			}
			results[i].Failed = true
			results[i].Output = []string{"not run: " + ctx.Err().Error()}
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			results[i] = runCheck(ctx, c, newBackend)
		})
	}
	wg.Wait()
	return results
}

// runCheck runs one check in a goroutine of its own, which Fatalf and
// Skip end, and returns its verdict.
func runCheck(ctx context.Context, c check, newBackend func(string) (Backend, error)) Result {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &result{name: c.name, ctx: ctx}
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if p := recover(); p != nil {
				r.Errorf("panic: %v", p)
			}
		}()
		b, err := newBackend(c.name)
		if err != nil {
			r.Fatalf("opening the backend: %v", err)
		}
		if b.Open == nil {
			r.Fatalf("storetest: Backend.Open is nil")
		}
		c.run(&suite{tb: r, b: b, epoch: time.Now()})
	}()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return Result{Name: c.name, Failed: r.failed, Skipped: r.skipped && !r.failed,
		Output: r.out, Elapsed: time.Since(start)}
}

// result is a check's tb under Check: it keeps what the check says, and
// ends the check's goroutine on Fatalf and Skip as package testing does.
type result struct {
	name string
	ctx  context.Context

	mu      sync.Mutex
	failed  bool
	skipped bool
	out     []string
}

func (r *result) Helper()                  {}
func (r *result) Name() string             { return r.name }
func (r *result) Context() context.Context { return r.ctx }

func (r *result) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *result) say(fail, skip bool, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = r.failed || fail
	r.skipped = r.skipped || skip
	r.out = append(r.out, msg)
}

func (r *result) Logf(format string, args ...any)   { r.say(false, false, fmt.Sprintf(format, args...)) }
func (r *result) Errorf(format string, args ...any) { r.say(true, false, fmt.Sprintf(format, args...)) }

func (r *result) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *result) Skip(args ...any) {
	r.say(false, true, strings.TrimSuffix(fmt.Sprintln(args...), "\n"))
	runtime.Goexit()
}

func (r *result) Skipf(format string, args ...any) {
	r.say(false, true, fmt.Sprintf(format, args...))
	runtime.Goexit()
}
