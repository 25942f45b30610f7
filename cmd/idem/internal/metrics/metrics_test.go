package metrics

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

func TestWritePrometheus(t *testing.T) {
	var r Registry
	ctx := context.Background()
	r.Observe(ctx, idem.Event{Op: idem.OpClaim, Outcome: idem.Claimed, TakeOver: true, Took: 300 * time.Microsecond})
	r.Observe(ctx, idem.Event{Op: idem.OpClaim, Outcome: idem.Duplicate, Took: 2 * time.Millisecond})
	r.Observe(ctx, idem.Event{Op: idem.OpRenew, Err: idem.ErrLeaseLost, Took: 20 * time.Second})
	r.Observe(ctx, idem.Event{Op: idem.OpConfirm, Late: true, Took: time.Millisecond})
	r.Observe(ctx, idem.Event{Op: idem.OpMessage, Err: fmt.Errorf("claim: %w", idem.ErrQuarantined), Took: time.Millisecond})
	var b strings.Builder
	if err := r.WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"# TYPE idem_operations_total counter\n",
		`idem_operations_total{op="claim",outcome="claimed"} 1` + "\n",
		`idem_operations_total{op="claim",outcome="duplicate"} 1` + "\n",
		`idem_operations_total{op="renew",error_class="lease_lost"} 1` + "\n",
		`idem_operations_total{op="confirm"} 1` + "\n",
		"# TYPE idem_operation_duration_seconds histogram\n",
		`idem_operation_duration_seconds_bucket{op="claim",le="0.00025"} 0` + "\n",
		`idem_operation_duration_seconds_bucket{op="claim",le="0.0005"} 1` + "\n",
		`idem_operation_duration_seconds_bucket{op="claim",le="0.0025"} 2` + "\n",
		`idem_operation_duration_seconds_bucket{op="claim",le="+Inf"} 2` + "\n",
		`idem_operation_duration_seconds_count{op="claim"} 2` + "\n",
		`idem_operation_duration_seconds_sum{op="claim"} 0.0023` + "\n",
		`idem_operation_duration_seconds_bucket{op="renew",le="10"} 0` + "\n",
		`idem_operation_duration_seconds_bucket{op="renew",le="+Inf"} 1` + "\n",
		`idem_operation_duration_seconds_bucket{op="confirm",le="0.001"} 1` + "\n", // le is inclusive
		`idem_takeovers_total{op="claim"} 1` + "\n",
		`idem_late_confirms_total{op="confirm"} 1` + "\n",
		`idem_operations_total{op="message",error_class="quarantined"} 1` + "\n",
		"# TYPE idem_quarantines_total counter\n",
		`idem_quarantines_total{op="message"} 1` + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	var tb strings.Builder
	r.WriteTable(&tb)
	for _, want := range []string{"claim          claimed      -                  1", "take-overs (claim): 1", "late confirms (confirm): 1", "quarantines (message): 1", "> 10s"} {
		if !strings.Contains(tb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tb.String())
		}
	}
}
