package storetest_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storetest"
)

// everyClaimWins is a store that breaks the contract: a claim of a key
// held by another answers Claimed, with a lease of its own.
type everyClaimWins struct{ idem.Store }

func (s everyClaimWins) Claim(ctx context.Context, key string, fp []byte) (idem.Claim, error) {
	c, err := s.Store.Claim(ctx, key, fp)
	if err == nil && c.Outcome == idem.InProgress {
		l := idem.Lease{Key: key, Token: c.Record.Token + 1, Owner: "w?", Expires: c.Record.Expires}
		return idem.Claim{Outcome: idem.Claimed, Lease: &l}, nil
	}
	return c, err
}

func TestCheckMemoryPasses(t *testing.T) {
	results := storetest.Check(context.Background(), func(string) (storetest.Backend, error) {
		return storetest.MemoryBackend(), nil
	})
	if len(results) < 30 {
		t.Fatalf("Check returned %d results; want one per check of the suite (more than 30)", len(results))
	}
	passed := 0
	for _, r := range results {
		switch {
		case r.Failed:
			t.Errorf("check %s on the memory store failed: %q; want it to pass", r.Name, r.Output)
		case r.Skipped:
			if len(r.Output) == 0 {
				t.Errorf("check %s skipped without a word; want the reason", r.Name)
			}
		default:
			passed++
		}
		if r.Name == "Linearizable" && (r.Failed || r.Skipped || !strings.Contains(strings.Join(r.Output, "\n"), "0 violations")) {
			t.Errorf("check Linearizable = %+v; want a pass with its tally (0 violations)", r)
		}
	}
	if passed < 30 {
		t.Errorf("%d checks passed on the memory store; want more than 30", passed)
	}
}

func TestCheckFindsBrokenStore(t *testing.T) {
	results := storetest.Check(context.Background(), func(check string) (storetest.Backend, error) {
		b := storetest.MemoryBackend()
		open := b.Open
		b.Open = func(o idem.Options) (idem.Store, error) {
			s, err := open(o)
			return everyClaimWins{s}, err
		}
		if check == "Claim/Fresh" {
			return storetest.Backend{}, errors.New("no backend for this one")
		}
		return b, nil
	})
	byName := map[string]storetest.Result{}
	for _, r := range results {
		byName[r.Name] = r
	}
	for name, says := range map[string]string{
		"Claim/InProgressOtherWorker": "want in_progress",
		"Claim/OneWinnerOf64":         "",
		"Claim/Fresh":                 "opening the backend: no backend for this one",
	} {
		r, ok := byName[name]
		if !ok || !r.Failed || !strings.Contains(strings.Join(r.Output, "\n"), says) {
			t.Errorf("check %s of a store where every claim wins = %+v; want a failure saying %q", name, r, says)
		}
	}
	// A failed check does not stop the others.
	if r := byName["Confirm/Result"]; r.Failed || r.Skipped {
		t.Errorf("check Confirm/Result = %+v; want a pass (the store confirms as it should)", r)
	}
}

// panicky is a store whose Claim panics.
type panicky struct{ idem.Store }

func (panicky) Claim(context.Context, string, []byte) (idem.Claim, error) { panic("claim exploded") }

// A check that panics fails with the panic, and the others run.
func TestCheckPanic(t *testing.T) {
	results := storetest.Check(context.Background(), func(check string) (storetest.Backend, error) {
		b := storetest.MemoryBackend()
		if check == "Claim/Fresh" {
			open := b.Open
			b.Open = func(o idem.Options) (idem.Store, error) {
				s, err := open(o)
				return panicky{s}, err
			}
		}
		return b, nil
	})
	for _, r := range results {
		switch {
		case r.Name == "Claim/Fresh":
			if !r.Failed || !strings.Contains(strings.Join(r.Output, "\n"), "panic: claim exploded") {
				t.Errorf("check Claim/Fresh on a store whose Claim panics = %+v; want a failure saying the panic", r)
			}
		case r.Failed:
			t.Errorf("check %s = %+v; want the others to pass", r.Name, r)
		}
	}
}

func TestCheckCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	results := storetest.Check(ctx, func(string) (storetest.Backend, error) { return storetest.MemoryBackend(), nil })
	// Cancelled before Check began: no check starts.
	for _, r := range results {
		if !r.Failed || len(r.Output) != 1 || !strings.HasPrefix(r.Output[0], "not run: ") {
			t.Errorf("Check with a cancelled context: %s = failed %v, %q; want failed, not run", r.Name, r.Failed, r.Output)
		}
	}
}
