// Package metrics is a small idem.Observer that counts operations and
// renders them in the Prometheus text format, with the names and labels the
// OpenTelemetry adapter (module github.com/idemgo/idem/otel) produces through
// the OpenTelemetry Prometheus exporter, so that the idem command can show
// them without the OpenTelemetry SDK in the root module.
package metrics

import (
	"context"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem"
)

// Buckets are the duration histogram's upper bounds in seconds, as the
// OpenTelemetry adapter's DurationBuckets.
var Buckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

type series struct {
	op      idem.Op
	outcome idem.Outcome
	class   idem.ErrorClass
}

type histogram struct {
	counts []uint64 // per bucket, not cumulative; the last is +Inf
	sum    float64
	n      uint64
}

// Registry counts the events it observes. Its zero value is ready; it is
// safe for concurrent use.
type Registry struct {
	mu        sync.Mutex
	ops       map[series]uint64
	durations map[idem.Op]*histogram
	takeovers map[idem.Op]uint64
	late      map[idem.Op]uint64
	// quarantines counts the events refused because their key is
	// quarantined (ClassQuarantined), by op.
	quarantines map[idem.Op]uint64
}

// Observe counts e.
func (r *Registry) Observe(_ context.Context, e idem.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ops == nil {
		r.ops, r.durations = map[series]uint64{}, map[idem.Op]*histogram{}
		r.takeovers, r.late = map[idem.Op]uint64{}, map[idem.Op]uint64{}
		r.quarantines = map[idem.Op]uint64{}
	}
	class := e.Class()
	r.ops[series{e.Op, e.Outcome, class}]++
	if class == idem.ClassQuarantined {
		r.quarantines[e.Op]++
	}
	h := r.durations[e.Op]
	if h == nil {
		h = &histogram{counts: make([]uint64, len(Buckets)+1)}
		r.durations[e.Op] = h
	}
	s := e.Took.Seconds()
	h.counts[sort.SearchFloat64s(Buckets, s)]++
	h.sum += s
	h.n++
	if e.TakeOver {
		r.takeovers[e.Op]++
	}
	if e.Late {
		r.late[e.Op]++
	}
}

// sortedSeries returns the counted series by op, outcome and class, so that
// output is stable. The caller holds r.mu.
func (r *Registry) sortedSeries() []series {
	ss := make([]series, 0, len(r.ops))
	for s := range r.ops {
		ss = append(ss, s)
	}
	sort.Slice(ss, func(i, j int) bool {
		a, c := ss[i], ss[j]
		if a.op != c.op {
			return a.op < c.op
		}
		if a.outcome != c.outcome {
			return a.outcome < c.outcome
		}
		return a.class < c.class
	})
	return ss
}

func (s series) labels() string {
	l := `op="` + s.op.String() + `"`
	if s.outcome != 0 {
		l += `,outcome="` + s.outcome.String() + `"`
	}
	if s.class != 0 {
		l += `,error_class="` + s.class.String() + `"`
	}
	return l
}

func sortedOps[V any](m map[idem.Op]V) []idem.Op {
	ops := make([]idem.Op, 0, len(m))
	for op := range m {
		ops = append(ops, op)
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i] < ops[j] })
	return ops
}

func float(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// WritePrometheus writes the metrics in the Prometheus text exposition
// format (version 0.0.4).
func (r *Registry) WritePrometheus(w io.Writer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	b.WriteString("# HELP idem_operations_total idem operations, by op, outcome and error class\n# TYPE idem_operations_total counter\n")
	ss := r.sortedSeries()
	for _, s := range ss {
		fmt.Fprintf(&b, "idem_operations_total{%s} %d\n", s.labels(), r.ops[s])
	}
	b.WriteString("# HELP idem_operation_duration_seconds Duration of idem operations, by op\n# TYPE idem_operation_duration_seconds histogram\n")
	for _, op := range sortedOps(r.durations) {
		h := r.durations[op]
		var cum uint64
		for i, le := range append(Buckets, math.Inf(1)) {
			cum += h.counts[i]
			bound := float(le)
			if math.IsInf(le, 1) {
				bound = "+Inf"
			}
			fmt.Fprintf(&b, "idem_operation_duration_seconds_bucket{op=%q,le=%q} %d\n", op.String(), bound, cum)
		}
		fmt.Fprintf(&b, "idem_operation_duration_seconds_sum{op=%q} %s\n", op.String(), float(h.sum))
		fmt.Fprintf(&b, "idem_operation_duration_seconds_count{op=%q} %d\n", op.String(), h.n)
	}
	for _, c := range []struct {
		name, help string
		m          map[idem.Op]uint64
	}{
		{"idem_takeovers_total", "Claims that took over an expired claim, by op", r.takeovers},
		{"idem_late_confirms_total", "Confirmations recorded after their lease was lost, by op", r.late},
		{"idem_quarantines_total", "Operations refused because their key is quarantined after repeated crashes, by op", r.quarantines},
	} {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n", c.name, c.help, c.name)
		for _, op := range sortedOps(c.m) {
			fmt.Fprintf(&b, "%s{op=%q} %d\n", c.name, op.String(), c.m[op])
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// quantile estimates the q-quantile of h from its buckets (the bucket's
// upper bound), as a Duration.
func (h *histogram) quantile(q float64) time.Duration {
	rank := uint64(math.Ceil(q * float64(h.n)))
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= rank && i < len(Buckets) {
			return time.Duration(Buckets[i] * float64(time.Second))
		}
	}
	return -1 // above the last bound
}

// WriteTable writes a table for people: each op's count by outcome and
// error class, take-overs, late confirms, quarantines, and duration
// percentiles (as
// bucket bounds: "≤").
func (r *Registry) WriteTable(w io.Writer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(w, "%-14s %-12s %-11s %8s\n", "op", "outcome", "error", "count")
	ss := r.sortedSeries()
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, s := range ss {
		fmt.Fprintf(w, "%-14s %-12s %-11s %8d\n", s.op, dash(outcomeName(s.outcome)), dash(s.class.String()), r.ops[s])
	}
	for _, op := range sortedOps(r.takeovers) {
		fmt.Fprintf(w, "take-overs (%s): %d\n", op, r.takeovers[op])
	}
	for _, op := range sortedOps(r.late) {
		fmt.Fprintf(w, "late confirms (%s): %d\n", op, r.late[op])
	}
	for _, op := range sortedOps(r.quarantines) {
		fmt.Fprintf(w, "quarantines (%s): %d\n", op, r.quarantines[op])
	}
	fmt.Fprintf(w, "%-14s %10s %10s %10s\n", "latency", "p50 ≤", "p99 ≤", "count")
	for _, op := range sortedOps(r.durations) {
		h := r.durations[op]
		q := func(q float64) string {
			d := h.quantile(q)
			if d < 0 {
				return "> 10s"
			}
			return d.String()
		}
		fmt.Fprintf(w, "%-14s %10s %10s %10d\n", op, q(0.5), q(0.99), h.n)
	}
}

// outcomeName is o's label, "" for no outcome.
func outcomeName(o idem.Outcome) string {
	if o == 0 {
		return ""
	}
	return o.String()
}
