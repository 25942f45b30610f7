package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Report is a run's results.
type Report struct {
	Config  Config
	Machine string
	Started time.Time
	Rows    []*Row
	Memory  *Memory // nil when the memory pass did not run
}

// Row is one contender's results.
type Row struct {
	Name, Group string
	Msgs        int
	// Rounds[i] holds the messages per second of each round at
	// Config.Goroutines[i].
	Rounds [][]float64
	// Throughput[i] is the median of Rounds[i].
	Throughput []float64
	Ratios     []Ratio
	Cost       Cost
	// ServerCPURounds[i] holds, for a contender that talks to Redis, the
	// microseconds of Redis CPU per message of each round at
	// Config.Goroutines[i]; ServerCPU[i] is their median, NaN when no round
	// there handled a message. Both are nil for other contenders, and for
	// one that handled no message at all.
	ServerCPURounds [][]float64
	ServerCPU       []float64
	// ClientCPURounds[i] holds the microseconds of this process's CPU
	// (user and system) per message of each round at Config.Goroutines[i];
	// ClientCPU[i] is their median, NaN when no round there handled a
	// message. It is the whole process's: the contender and its client,
	// but also the garbage collector (garbage of earlier rounds too), the
	// runtime, system calls and the kernel's loopback network work, part
	// of which a sender pays for its receiver. Both are nil where the
	// system cannot read a process's CPU time, or no round handled a
	// message.
	ClientCPURounds [][]float64
	ClientCPU       []float64
}

// Ratio compares a contender with another measured in the same rounds.
type Ratio struct {
	Versus string
	// Median[i] is the median, over rounds, of the ratio of the two
	// throughputs in one round, at Config.Goroutines[i].
	Median []float64
	// Min[i] and Max[i] are the lowest and highest per-round ratio: how
	// far the machine's noise moved it.
	Min, Max []float64
}

func (rep *Report) summarize(sel []Contender) {
	byName := map[string]*Row{}
	for _, r := range rep.Rows {
		byName[r.Name] = r
		r.Throughput = make([]float64, len(r.Rounds))
		for i, rs := range r.Rounds {
			r.Throughput[i] = median(rs)
		}
		r.ServerCPU = medians(&r.ServerCPURounds)
		r.ClientCPU = medians(&r.ClientCPURounds)
	}
	for i, c := range sel {
		r := rep.Rows[i]
		for _, v := range c.Versus {
			o, ok := byName[v]
			if !ok {
				continue // not selected in this run
			}
			n := len(r.Rounds)
			ra := Ratio{Versus: v, Median: make([]float64, n), Min: make([]float64, n), Max: make([]float64, n)}
			for gi := range r.Rounds {
				per := make([]float64, len(r.Rounds[gi]))
				for k := range per {
					per[k] = r.Rounds[gi][k] / o.Rounds[gi][k]
				}
				ra.Median[gi] = median(per)
				ra.Min[gi], ra.Max[gi] = slices.Min(per), slices.Max(per)
			}
			r.Ratios = append(r.Ratios, ra)
		}
	}
}

// Row returns the named contender's row, or nil.
func (rep *Report) Row(name string) *Row {
	for _, r := range rep.Rows {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// Ratio returns the median per-round ratio of contender to versus at g
// goroutines; ok is false when either did not run, or not at g.
func (rep *Report) Ratio(contender, versus string, g int) (float64, bool) {
	gi := slices.Index(rep.Config.Goroutines, g)
	r := rep.Row(contender)
	if gi < 0 || r == nil {
		return 0, false
	}
	for _, ra := range r.Ratios {
		if ra.Versus == versus {
			return ra.Median[gi], true
		}
	}
	return 0, false
}

// medians returns the median of each of *rounds (NaN for one without a
// figure), or nil, setting *rounds to nil too, when none holds a figure:
// a contender the figure does not apply to, or that handled no message.
func medians(rounds *[][]float64) []float64 {
	if !slices.ContainsFunc(*rounds, func(rs []float64) bool { return len(rs) > 0 }) {
		*rounds = nil
		return nil
	}
	m := make([]float64, len(*rounds))
	for i, rs := range *rounds {
		m[i] = math.NaN() // no round at this goroutine count handled a message
		if len(rs) > 0 {
			m[i] = median(rs)
		}
	}
	return m
}

// micros formats microseconds for the table: "–" where there is no figure.
func micros(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.1f", v)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// TargetResult is a Target's verdict in one run.
type TargetResult struct {
	Target
	Ratio float64
	Met   bool
	Ran   bool // false when the run did not measure it
}

// Targets judges ts against the report.
func (rep *Report) Targets(ts []Target) []TargetResult {
	out := make([]TargetResult, len(ts))
	for i, t := range ts {
		v, ok := rep.Ratio(t.Contender, t.Versus, t.Goroutines)
		out[i] = TargetResult{Target: t, Ratio: v, Ran: ok, Met: ok && v >= t.Min}
	}
	return out
}

// WriteMarkdown writes the report as markdown: the conditions, one table of
// throughput (median msgs/s per goroutine count), the Redis and client CPU
// per message (rows beginning "↳", median over rounds), ratios (rows beginning "÷": the
// median, then the lowest and highest round in small print) and costs per
// message, then the memory figure and the targets.
func (rep *Report) WriteMarkdown(w io.Writer, targets []Target) error {
	c := rep.Config
	var b strings.Builder
	fmt.Fprintf(&b, "Run of %s on %s. %d rounds of %v per contender and goroutine count, contenders alternating; "+
		"throughput is the median over rounds, a ratio the median of per-round ratios (in small print: the lowest and highest round); "+
		"CPU per message, median over rounds, is a round's CPU divided by its messages: Redis's (used_cpu_user + used_cpu_sys) "+
		"and the client's (this process's user + system time, which includes the kernel's work on its sockets).\n\n",
		rep.Started.UTC().Format("2006-01-02 15:04 MST"), rep.Machine, c.Rounds, c.Duration)
	b.WriteString("| contender |")
	for _, g := range c.Goroutines {
		fmt.Fprintf(&b, " %d gor. |", g)
	}
	b.WriteString(" cmds sent/msg | round trips/msg | cmds run/msg | allocs/msg | B/msg |\n|---|")
	for range c.Goroutines {
		b.WriteString("--:|")
	}
	b.WriteString("--:|--:|--:|--:|--:|\n")
	group := ""
	for _, r := range rep.Rows {
		if r.Group != group && group != "" {
			// An empty row between groups keeps one table readable.
			b.WriteString("| |" + strings.Repeat(" |", len(c.Goroutines)+5) + "\n")
		}
		group = r.Group
		fmt.Fprintf(&b, "| **%s** |", r.Name)
		for _, t := range r.Throughput {
			fmt.Fprintf(&b, " %s |", rate(t))
		}
		if r.Cost.Redis {
			fmt.Fprintf(&b, " %.2f | %.2f | %.2f |", r.Cost.Sent, r.Cost.RoundTrips, r.Cost.Ran)
		} else {
			b.WriteString(" – | – | – |")
		}
		fmt.Fprintf(&b, " %.1f | %.0f |\n", r.Cost.Allocs, r.Cost.Bytes)
		if r.ServerCPU != nil || r.ClientCPU != nil {
			label := "CPU per message: Redis + client"
			if r.ClientCPU == nil {
				label = "Redis CPU per message"
			} else if r.ServerCPU == nil {
				label = "client CPU per message"
			}
			fmt.Fprintf(&b, "| ↳ %s |", label)
			for i := range c.Goroutines {
				var parts []string
				for _, fig := range [][]float64{r.ServerCPU, r.ClientCPU} {
					if fig != nil {
						parts = append(parts, micros(fig[i]))
					}
				}
				cell := strings.Join(parts, " + ") + " µs"
				if !slices.ContainsFunc(parts, func(p string) bool { return p != "–" }) {
					cell = "–"
				}
				fmt.Fprintf(&b, " %s |", cell)
			}
			b.WriteString(strings.Repeat(" |", 5) + "\n")
		}
		for _, ra := range r.Ratios {
			fmt.Fprintf(&b, "| ÷ %s |", ra.Versus)
			for gi, v := range ra.Median {
				fmt.Fprintf(&b, " %.2f× <sub>%.2f–%.2f</sub> |", v, ra.Min[gi], ra.Max[gi])
			}
			b.WriteString(strings.Repeat(" |", 5) + "\n")
		}
	}
	if m := rep.Memory; m != nil {
		verdict := "met"
		if m.UsedMemory > MaxBytesPerRecord {
			verdict = "NOT met"
		}
		fmt.Fprintf(&b, "\nRedis memory per confirmed record (%d records, %d-byte Redis key: a 36-byte key, the default prefix; "+
			"no fingerprint, empty result): **%.1f bytes** (used_memory delta / records; target ≤ %d: %s); "+
			"MEMORY USAGE of one record: %.0f bytes.\n",
			m.Records, m.KeyLen, m.UsedMemory, MaxBytesPerRecord, verdict, m.MemoryUsage)
		fmt.Fprintf(&b, "\nRedis CPU to expire a confirmed record when its retention ends: **%.1f µs** (the same %d records "+
			"expiring evenly over %v, nothing reading them; less the idle server's CPU over as long). "+
			"No per-message figure above includes it: each round's records are deleted, outside the timed window, before they expire.\n",
			m.ExpireCPU, m.Records, m.ExpireSpread)
	}
	if rs := rep.Targets(targets); len(rs) > 0 {
		b.WriteString("\nTargets:\n\n")
		for _, t := range rs {
			switch {
			case !t.Ran:
				fmt.Fprintf(&b, "- %s at %d goroutines: not measured in this run\n", t.What, t.Goroutines)
			case t.Met:
				fmt.Fprintf(&b, "- %s at %d goroutines: **met**, %.2f×\n", t.What, t.Goroutines, t.Ratio)
			default:
				fmt.Fprintf(&b, "- %s at %d goroutines: **NOT met**, %.2f×\n", t.What, t.Goroutines, t.Ratio)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// rate formats messages per second compactly: 812, 41.2k, 1.23M.
func rate(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 2, 64) + "M"
	case v >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', 2, 64) + "k"
	default:
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
}
