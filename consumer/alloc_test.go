package consumer_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// Allocations on a MemoryStore with no Observer, measured
// (testing.AllocsPerRun, Go 1.26) on the wrappers before they reported
// events; each figure includes the test's own key string(s).
const (
	baseMessageAllocs   = 20  // Idempotent, a new key
	baseDuplicateAllocs = 1   // Idempotent, a redelivery
	baseBatchAllocs     = 145 // Batch of 10 new keys
)

type nopObserver struct{}

func (nopObserver) Observe(context.Context, idem.Event) {}

// With no Observer the wrappers allocate what they did before they could
// report events, so any allocation the observing adds on the unobserved
// path fails here; with one, reporting stays cheap.
func TestObserverAllocations(t *testing.T) {
	if testing.CoverMode() != "" || testenv.RaceEnabled {
		t.Skip("allocation counts differ under -cover and -race")
	}
	ctx := context.Background()
	nop := func(context.Context, string) error { return nil }
	id := func(s string) string { return s }
	measure := func(opts consumer.Options[string]) (one, dup, batch float64) {
		h := consumer.Idempotent(memStore(idem.Options{}), id, nop, opts)
		b := consumer.Batch(memStore(idem.Options{}), id, nop, opts)
		i := 0
		_ = h(ctx, "m1")
		one = testing.AllocsPerRun(200, func() { i++; _ = h(ctx, "m"+strconv.Itoa(i)) })
		dup = testing.AllocsPerRun(200, func() { _ = h(ctx, "m1") })
		ms := make([]string, 10)
		batch = testing.AllocsPerRun(100, func() {
			for j := range ms {
				i++
				ms[j] = "b" + strconv.Itoa(i)
			}
			_ = b(ctx, ms)
		})
		return one, dup, batch
	}
	one, dup, batch := measure(consumer.Options[string]{})
	t.Logf("no Observer: message %.0f, duplicate %.0f, batch of 10 %.0f allocs", one, dup, batch)
	if one > baseMessageAllocs || dup > baseDuplicateAllocs || batch > baseBatchAllocs {
		t.Errorf("no Observer: %.0f, %.0f, %.0f allocs; want at most %d, %d, %d, as before events existed",
			one, dup, batch, baseMessageAllocs, baseDuplicateAllocs, baseBatchAllocs)
	}
	oneOn, dupOn, batchOn := measure(consumer.Options[string]{Observer: nopObserver{}})
	t.Logf("no-op Observer: message %.0f, duplicate %.0f, batch of 10 %.0f allocs", oneOn, dupOn, batchOn)
	// The key's hash per message, and the batch's per-message records.
	if oneOn > one+2 || dupOn > dup+2 || batchOn > batch+10*2+4 {
		t.Errorf("no-op Observer: %.0f, %.0f, %.0f allocs; want at most %.0f, %.0f, %.0f", oneOn, dupOn, batchOn, one+2, dup+2, batch+24)
	}
}
