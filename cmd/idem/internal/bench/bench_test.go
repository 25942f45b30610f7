package bench

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// sleeper is a contender whose every op takes d: its throughput on g
// goroutines is known, so the harness's arithmetic can be checked.
func sleeper(name string, d time.Duration, versus ...string) Contender {
	return Contender{Name: name, Group: GroupHTTP, Versus: versus,
		Open: func(context.Context, *Env) (*Instance, error) {
			return &Instance{Worker: func() Op {
				return func(ctx context.Context) error { time.Sleep(d); return nil }
			}}, nil
		}}
}

// spinner is a contender whose every op keeps a CPU busy for d.
func spinner(name string, d time.Duration) Contender {
	return Contender{Name: name, Group: GroupHTTP,
		Open: func(context.Context, *Env) (*Instance, error) {
			return &Instance{Worker: func() Op {
				return func(ctx context.Context) error {
					for t0 := time.Now(); time.Since(t0) < d; {
					}
					return nil
				}
			}}, nil
		}}
}

func miniEnv(t *testing.T) Env {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return Env{Redis: c}
}

// canReadCPU reports whether this system lets Run read the process's CPU
// time; where it cannot, no contender may have a client CPU figure.
func canReadCPU() bool {
	_, ok := processCPU()
	return ok
}

// checkClientCPU fails t unless r has a client CPU figure for each of gs,
// from rounds rounds, each within [lo, hi] µs, or, where the system cannot
// read a process's CPU time, none at all.
func checkClientCPU(t *testing.T, r *Row, gs []int, rounds int, lo, hi float64) {
	t.Helper()
	if !canReadCPU() {
		if r.ClientCPU != nil {
			t.Errorf("%s: client CPU %v on a system that cannot read it; want none", r.Name, r.ClientCPU)
		}
		return
	}
	checkCPU(t, r.Name+": client", r.ClientCPU, r.ClientCPURounds, gs, rounds, lo, hi)
}

// checkCPU fails t unless fig, a CPU figure of what, has a median for each
// of gs, from rounds rounds, each within [lo, hi] µs.
func checkCPU(t *testing.T, what string, fig []float64, perRound [][]float64, gs []int, rounds int, lo, hi float64) {
	t.Helper()
	if len(fig) != len(gs) {
		t.Errorf("%s CPU at %d goroutine counts; want %d", what, len(fig), len(gs))
		return
	}
	for gi, v := range fig {
		if !(v >= lo && v <= hi) || len(perRound[gi]) != rounds {
			t.Errorf("%s CPU at %d goroutines: %v µs per message over rounds %v; want %g to %g µs, %d rounds",
				what, gs[gi], v, perRound[gi], lo, hi, rounds)
		}
	}
}

// TestRunClientCPU runs a contender whose op spins for 1ms on one
// goroutine: the process's CPU per message must be about 1ms (less when
// other processes take the CPU from it). A figure in the wrong unit (ns,
// ms), not divided by the messages, or taken from wall time over a
// sleep, lands outside.
func TestRunClientCPU(t *testing.T) {
	rep, err := Run(context.Background(), miniEnv(t), []Contender{spinner("spin", time.Millisecond)}, Config{
		Groups: []string{GroupHTTP}, Goroutines: []int{1}, Rounds: 2,
		Duration: 100 * time.Millisecond, CostMsgs: 10,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkClientCPU(t, rep.Row("spin"), []int{1}, 2, 300, 1500)
}

// TestRunRatios runs two contenders whose ops take 5ms and 10ms: the fast
// one's throughput must be about twice the slow one's, and g goroutines
// about g times one.
func TestRunRatios(t *testing.T) {
	cs := []Contender{sleeper("fast", 5*time.Millisecond, "slow"), sleeper("slow", 25*time.Millisecond)}
	rep, err := Run(context.Background(), miniEnv(t), cs, Config{
		Groups: []string{GroupHTTP}, Goroutines: []int{1, 4}, Rounds: 3,
		Duration: 150 * time.Millisecond, CostMsgs: 10,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	fast, slow := rep.Row("fast"), rep.Row("slow")
	for gi, g := range []int{1, 4} {
		if n := len(fast.Rounds[gi]); n != 3 {
			t.Errorf("fast at %d goroutines: %d rounds; want 3", g, n)
		}
		// Sleeps overshoot, by more on a loaded machine: 25ms and 5ms
		// sleeps, ideally 5 apart, keep the ratio above 1.5 until they
		// overshoot by 35ms each on average.
		r, ok := rep.Ratio("fast", "slow", g)
		if !ok || r < 1.5 || r > 5.5 {
			t.Errorf("Ratio(fast, slow, %d) = %.2f, %v; want at most 5", g, r, ok)
		}
		// The ratio is the median of per-round ratios, not a ratio of
		// medians.
		per := make([]float64, 3)
		for k := range per {
			per[k] = fast.Rounds[gi][k] / slow.Rounds[gi][k]
		}
		if want := median(per); r != want {
			t.Errorf("Ratio(fast, slow, %d) = %v; want the median of %v = %v", g, r, per, want)
		}
		if want := 1 / (5 * time.Millisecond).Seconds() * float64(g); fast.Throughput[gi] > want*1.05 || fast.Throughput[gi] < want*0.1 {
			t.Errorf("fast at %d goroutines: %.0f ops/s; want a little under %.0f", g, fast.Throughput[gi], want)
		}
	}
	if _, ok := rep.Ratio("slow", "fast", 1); ok {
		t.Errorf("Ratio(slow, fast) exists; want only the ratios Versus names")
	}
	if fast.ServerCPU != nil || fast.ServerCPURounds != nil {
		t.Errorf("fast: Redis CPU %v; want none for a contender that does not talk to Redis", fast.ServerCPU)
	}
	// An op that sleeps 5ms costs the process little CPU: a figure in ns,
	// or taken from wall time, lands above 2000 µs.
	for _, r := range []*Row{fast, slow} {
		checkClientCPU(t, r, []int{1, 4}, 3, 0, 2000)
	}
	if c := fast.Cost; c.Msgs != 10 || c.Redis {
		t.Errorf("fast's cost = %+v; want 10 messages and no Redis figures", c)
	}
	rs := rep.Targets([]Target{
		{What: "fast ≥ 1.5× slow", Contender: "fast", Versus: "slow", Goroutines: 4, Min: 1.5},
		{What: "fast ≥ 6× slow", Contender: "fast", Versus: "slow", Goroutines: 4, Min: 6},
		{What: "at 64", Contender: "fast", Versus: "slow", Goroutines: 64, Min: 1},
	})
	if !rs[0].Met || rs[1].Met || rs[2].Ran {
		t.Errorf("Targets = %+v; want met, not met, not run", rs)
	}
}

// TestRunStopsOnError: a contender that fails is an error, not a row.
func TestRunStopsOnError(t *testing.T) {
	bad := Contender{Name: "bad", Group: GroupHTTP, Open: func(context.Context, *Env) (*Instance, error) {
		return &Instance{Worker: func() Op {
			return func(context.Context) error { return fmt.Errorf("broken") }
		}}, nil
	}}
	_, err := Run(context.Background(), miniEnv(t), []Contender{bad}, Config{Groups: []string{GroupHTTP}, Rounds: 1, Duration: 10 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "broken") {
		t.Errorf("Run with a failing contender = %v; want its error", err)
	}
}

// TestRunCleansRounds: every round of a contender that writes to Redis
// starts without the run's keys, the run leaves none behind, and a key that
// is not the run's survives.
func TestRunCleansRounds(t *testing.T) {
	c := testenv.Redis(t)
	ctx := context.Background()
	other := testenv.UniquePrefix() + "other"
	if err := c.Set(ctx, other, "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Del(context.Background(), other).Err() })
	var (
		prefix        string
		rounds, dirty atomic.Int64
	)
	runKeys := func() int {
		keys, err := c.Keys(ctx, "*"+prefix+"*").Result()
		if err != nil {
			t.Error(err)
		}
		return len(keys)
	}
	// The writer writes a key of its own and a record through a RedisStore,
	// whose Redis key only contains the run's prefix.
	writer := Contender{Name: "writer", Group: GroupRedis, Redis: true, Open: func(_ context.Context, e *Env) (*Instance, error) {
		prefix = e.prefix
		s, err := newRedisStore(c)
		if err != nil {
			return nil, err
		}
		store := ClaimConfirm(e, s, "s")
		// Each goroutine's Worker is called before any of the round's ops.
		return &Instance{Worker: func() Op {
			rounds.Add(1)
			if runKeys() != 0 {
				dirty.Add(1)
			}
			record := store.Worker()
			return func(ctx context.Context) error {
				if err := c.Set(ctx, e.Key("w"), "x", 10*time.Minute).Err(); err != nil {
					return err
				}
				return record(ctx)
			}
		}}, nil
	}}
	_, err := Run(ctx, Env{Redis: c}, []Contender{writer}, Config{
		Groups: []string{GroupRedis}, Goroutines: []int{1, 2}, Rounds: 2,
		Duration: 30 * time.Millisecond, CostMsgs: 10, MemoryRecords: -1,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if prefix == "" || rounds.Load() == 0 {
		t.Fatalf("writer never ran")
	}
	if n := dirty.Load(); n != 0 {
		t.Errorf("%d of %d workers began a round with the run's keys in Redis; want none", n, rounds.Load())
	}
	if n := runKeys(); n != 0 {
		t.Errorf("%d of the run's keys left after Run; want none", n)
	}
	if n, err := c.Exists(ctx, other).Result(); err != nil || n != 1 {
		t.Errorf("EXISTS %s (not the run's) = %d, %v; want 1", other, n, err)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	cs := []Contender{sleeper("a", time.Millisecond)}
	for _, tc := range []struct {
		name string
		env  Env
		cfg  Config
	}{
		{"unknown group", miniEnv(t), Config{Groups: []string{"nosuch"}}},
		{"redis group without Redis", Env{}, Config{Groups: []string{GroupRedis}}},
		{"sql group without Postgres", miniEnv(t), Config{Groups: []string{GroupSQL}}},
		{"no goroutines", miniEnv(t), Config{Groups: []string{GroupHTTP}, Goroutines: []int{0}}},
		{"negative rounds", miniEnv(t), Config{Groups: []string{GroupHTTP}, Rounds: -1}},
		{"nothing selected", miniEnv(t), Config{Groups: []string{GroupHTTP}, Only: func(string) bool { return false }}},
	} {
		if _, err := Run(context.Background(), tc.env, cs, tc.cfg); err == nil {
			t.Errorf("%s: Run succeeded; want an error", tc.name)
		}
	}
}

// TestSmoke runs every contender of the real table, briefly, on the real
// services, and checks what the report says a message costs against what
// each contender is known to send.
func TestSmoke(t *testing.T) {
	// A Redis of its own: the memory pass waits for Redis's active expiry,
	// which crawls on a shared Redis holding many long-lived keys of other
	// tests (1000 keys not expired in 30s, seen on a developer's servers).
	srv := testenv.StartRedisServer(t, "--appendonly", "no")
	own := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = own.Close() })
	env := Env{Redis: own, Cluster: testenv.Cluster(t), DB: sqltest.Postgres(t)}
	env.DB.SetMaxOpenConns(8)
	gs := []int{1, 4}
	rep, err := Run(context.Background(), env, Contenders, Config{
		Goroutines: gs, Rounds: 2, Duration: 60 * time.Millisecond, Warmup: 20 * time.Millisecond,
		CostMsgs: 200, MemoryRecords: 1000, ExpireSpread: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(rep.Rows) != len(Contenders) {
		t.Fatalf("%d rows; want one per contender (%d)", len(rep.Rows), len(Contenders))
	}
	for _, r := range rep.Rows {
		for gi, v := range r.Throughput {
			if !(v > 0) || len(r.Rounds[gi]) != 2 {
				t.Errorf("%s at %d goroutines: %v msgs/s over %d rounds; want > 0 over 2", r.Name, gs[gi], v, len(r.Rounds[gi]))
			}
		}
		if r.Cost.Allocs < 1 {
			t.Errorf("%s: %.1f allocations per message; want at least one", r.Name, r.Cost.Allocs)
		}
		// The process's CPU per message: a figure per goroutine count for
		// every contender, more than nothing and less than 0.1 s.
		checkClientCPU(t, r, gs, 2, math.SmallestNonzeroFloat64, 100_000)
		// Redis CPU per message: for every contender that talks to Redis, a
		// figure per goroutine count (other tests may share the server, so
		// only that Redis did some work); none for the others.
		if !contender(r.Name).Redis {
			if r.ServerCPU != nil {
				t.Errorf("%s: Redis CPU %v; want none for a contender that does not talk to Redis", r.Name, r.ServerCPU)
			}
			continue
		}
		checkCPU(t, r.Name+": Redis", r.ServerCPU, r.ServerCPURounds, gs, 2, math.SmallestNonzeroFloat64, 100_000)
	}
	// Commands and round trips per message: what each contender sends is
	// known exactly. Redis runs at least that many (a script's calls add
	// to its EVALSHA; other tests may share the server, so only a floor).
	for _, w := range []struct {
		name             string
		sent, trips, ran float64
	}{
		{NameSetFloor, 2, 2, 2},
		{NameCheckThenSet, 3, 3, 3},
		{NameRedislock, 2, 2, 4},    // EVALSHA obtain (SET NX inside), EVALSHA release (GET, DEL inside)
		{NameClaimConfirm, 2, 2, 4}, // two EVALSHA, each with calls inside
		{NameNoAutoPipeline, 2, 2, 4},
		{NameReplayClaim, 1, 1, 2}, // EVALSHA (calls inside): a Claim that finds the confirmation
		{NameNoAutoPipelineReplay, 1, 1, 2},
		{NameMix, 1.2, 1.2, 2.4}, // 4 duplicates (1 EVALSHA each), 1 new key (2) in 5 messages
		{NameNoAutoPipelineMix, 1.2, 1.2, 2.4},
		{NameScriptFloor, 2, 2, 6}, // EVALSHA (TIME, SET NX), EVALSHA (GET, SET)
		{NameBatch, 0.02, 0.02, 2}, // one pipeline of 100 EVALSHA each way
		{NameClusterClaimConfirm, 2, 2, 4},
		{NameClusterSetFloor, 2, 2, 2},
		{NameReplay, 1, 1, 2}, // a Claim that finds the confirmation
	} {
		c := rep.Row(w.name).Cost
		if !c.Redis || c.Sent != w.sent || c.RoundTrips != w.trips || c.Ran < w.ran {
			t.Errorf("%s: sent %.2f, round trips %.2f, ran %.2f per message; want %.2f, %.2f, at least %.2f",
				w.name, c.Sent, c.RoundTrips, c.Ran, w.sent, w.trips, w.ran)
		}
	}
	// Behind a Cache, a duplicate goes to Redis once per key and MaxAge:
	// the replay sends next to nothing, the mix its new keys' two
	// commands and a few first reads of hot keys.
	if c := rep.Row(NameCacheReplayClaim).Cost; c.Sent > 0.05 {
		t.Errorf("%s: sent %.3f commands per message; want next to none", NameCacheReplayClaim, c.Sent)
	}
	if c := rep.Row(NameCacheMix).Cost; c.Sent < 0.4 || c.Sent > 0.5 {
		t.Errorf("%s: sent %.3f commands per message; want 0.4 (a new key's Claim and Confirm one time in five) and a few more", NameCacheMix, c.Sent)
	}
	if c := rep.Row(NameFirstWrite).Cost; c.Sent < 2 {
		t.Errorf("middleware first write: %.2f commands per request; want a Claim and a Confirm at least", c.Sent)
	}
	if c := rep.Row(NameBare).Cost; c.Redis {
		t.Errorf("bare handler: cost has Redis figures; want none")
	}
	// A record is a key of 43 bytes and a value of a few dozen: Redis
	// cannot store it in less than ~80 bytes nor need 400. used_memory is
	// not checked here: other tests write to the same Redis meanwhile.
	if m := rep.Memory; m == nil || m.KeyLen != 43 || m.MemoryUsage < 80 || m.MemoryUsage > 400 {
		t.Errorf("Memory = %+v; want a 43-byte key and 80-400 bytes of MEMORY USAGE", m)
	}
	// Other tests load the same Redis, so the expiry figure is only checked
	// to be reported (TestMeasureExpiry checks it on a Redis of its own).
	if m := rep.Memory; m == nil || m.ExpireSpread != 200*time.Millisecond || math.IsNaN(m.ExpireCPU) || math.IsInf(m.ExpireCPU, 0) {
		t.Errorf("Memory = %+v; want the expiry pass run over 200ms, with a finite figure", m)
	}

	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md, DefaultTargets); err != nil {
		t.Fatal(err)
	}
	checkMarkdown(t, md.String(), rep)
	if want := fmt.Sprintf("expire a confirmed record when its retention ends: **%.1f µs**", rep.Memory.ExpireCPU); !strings.Contains(md.String(), want) {
		t.Errorf("markdown lacks %q", want)
	}
	var svg bytes.Buffer
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	checkSVG(t, svg.Bytes(), rep)
}

// checkMarkdown: one table, a bold row per contender with its throughput,
// a "÷" row per ratio with its value, and a verdict per target.
func checkMarkdown(t *testing.T, md string, rep *Report) {
	t.Helper()
	rows := map[string][]string{}
	var ratios, cpus []string
	tables, inTable := 0, false
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "|") {
			inTable = false
			continue
		}
		if !inTable {
			tables++
			inTable = true
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if name, ok := strings.CutPrefix(cells[0], "**"); ok {
			rows[strings.TrimSuffix(name, "**")] = cells[1:]
		}
		if strings.HasPrefix(cells[0], "÷ ") {
			ratios = append(ratios, cells[1])
		}
		if strings.HasPrefix(cells[0], "↳ ") {
			cpus = append(cpus, cells[0]+": "+cells[1])
		}
	}
	if tables != 1 {
		t.Errorf("markdown has %d tables; want 1:\n%s", tables, md)
	}
	for _, r := range rep.Rows {
		cells, ok := rows[r.Name]
		if !ok {
			t.Errorf("markdown has no row for %q", r.Name)
			continue
		}
		if cells[0] != rate(r.Throughput[0]) {
			t.Errorf("markdown row %q: first cell %q; want %q", r.Name, cells[0], rate(r.Throughput[0]))
		}
	}
	var wantCPUs []string
	for _, r := range rep.Rows {
		switch {
		case r.ServerCPU != nil && r.ClientCPU != nil:
			wantCPUs = append(wantCPUs, fmt.Sprintf("↳ CPU per message: Redis + client: %.1f + %.1f µs", r.ServerCPU[0], r.ClientCPU[0]))
		case r.ServerCPU != nil:
			wantCPUs = append(wantCPUs, fmt.Sprintf("↳ Redis CPU per message: %.1f µs", r.ServerCPU[0]))
		case r.ClientCPU != nil:
			wantCPUs = append(wantCPUs, fmt.Sprintf("↳ client CPU per message: %.1f µs", r.ClientCPU[0]))
		}
	}
	if !slices.Equal(cpus, wantCPUs) {
		t.Errorf("markdown CPU rows, first column = %q; want %q", cpus, wantCPUs)
	}
	nRatios := 0
	for _, r := range rep.Rows {
		nRatios += len(r.Ratios)
	}
	if len(ratios) != nRatios {
		t.Errorf("markdown has %d ratio rows; want %d", len(ratios), nRatios)
	}
	// The first ratio row is the defaults' first Versus: NoAutoPipeline.
	v, _ := rep.Ratio(NameClaimConfirm, NameNoAutoPipeline, 1)
	ra := rep.Row(NameClaimConfirm).Ratios[0]
	if ra.Versus != NameNoAutoPipeline {
		t.Errorf("first ratio of %s is versus %q; want %q", NameClaimConfirm, ra.Versus, NameNoAutoPipeline)
	}
	if ra.Min[0] > v || v > ra.Max[0] {
		t.Errorf("ratio %.2f outside its rounds' range %.2f-%.2f", v, ra.Min[0], ra.Max[0])
	}
	if want := fmt.Sprintf("%.2f× <sub>%.2f–%.2f</sub>", v, ra.Min[0], ra.Max[0]); len(ratios) == 0 || ratios[0] != want {
		t.Errorf("first ratio row = %v; want %s (defaults ÷ NoAutoPipeline at 1 goroutine)", ratios, want)
	}
	if n := strings.Count(md, "not measured in this run"); n != len(DefaultTargets) {
		// 64 goroutines is not in the smoke run: every target says so.
		t.Errorf("markdown says %d targets were not measured; want %d:\n%s", n, len(DefaultTargets), md)
	}
}

// checkSVG: well-formed, one line per contender through one point per
// goroutine count, x growing with goroutines, and a contender with more
// throughput drawn higher (smaller y).
func checkSVG(t *testing.T, b []byte, rep *Report) {
	t.Helper()
	var doc struct {
		Lines []struct {
			Points string `xml:"points,attr"`
		} `xml:"polyline"`
		Texts []string `xml:"text"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("the chart is not well-formed XML: %v", err)
	}
	if len(doc.Lines) != len(rep.Rows) {
		t.Fatalf("the chart has %d lines; want %d", len(doc.Lines), len(rep.Rows))
	}
	ys := make([][]float64, len(doc.Lines))
	for i, l := range doc.Lines {
		pts := strings.Fields(l.Points)
		if len(pts) != len(rep.Config.Goroutines) {
			t.Fatalf("line %d has %d points; want %d", i, len(pts), len(rep.Config.Goroutines))
		}
		lastX := -1.0
		for _, p := range pts {
			xs, y, _ := strings.Cut(p, ",")
			x, _ := strconv.ParseFloat(xs, 64)
			yv, _ := strconv.ParseFloat(y, 64)
			if x <= lastX {
				t.Errorf("line %d: x does not grow with goroutines: %s", i, l.Points)
			}
			lastX = x
			ys[i] = append(ys[i], yv)
		}
	}
	for i := range rep.Rows {
		for j := range rep.Rows {
			a, b := rep.Rows[i].Throughput[0], rep.Rows[j].Throughput[0]
			// 1% apart at least: closer lines may round to one pixel row.
			if a > b*1.01 && ys[i][0] >= ys[j][0] {
				t.Errorf("%s (%.0f/s) is drawn at y=%.1f, not above %s (%.0f/s) at y=%.1f",
					rep.Rows[i].Name, a, ys[i][0], rep.Rows[j].Name, b, ys[j][0])
			}
		}
	}
	legend := strings.Join(doc.Texts, "\n")
	for _, r := range rep.Rows {
		if !strings.Contains(legend, r.Name) {
			t.Errorf("the chart's legend lacks %q", r.Name)
		}
	}
}

// contender returns the entry of Contenders named name.
func contender(name string) Contender {
	for _, c := range Contenders {
		if c.Name == name {
			return c
		}
	}
	panic("no contender " + name)
}

// TestMeasureExpiry lets records expire on a Redis of the test's own, where
// nothing else runs: every key must be gone when it returns, and the cost
// per key must be what deleting a small key costs, a few microseconds, not
// nothing and not a runaway.
func TestMeasureExpiry(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	keys := make([]string, 20_000)
	for i := range keys {
		keys[i] = "idem:{" + strconv.Itoa(i) + "}"
	}
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Set(ctx, k, "1D1764500000000000:0:", 10*time.Minute)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cost, err := measureExpiry(ctx, c, keys, 300*time.Millisecond)
	if err != nil {
		t.Fatalf("measureExpiry: %v", err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Errorf("DBSIZE after measureExpiry = %d, %v; want every key expired", n, err)
	}
	// Removing a small key costs this Redis about a microsecond: a unit
	// gone wrong is a thousand times off, a runaway far above. The bounds
	// leave room for the shared server's other clients, whose CPU the
	// baseline subtracts (seen: 0.18 µs while other packages ran).
	if !(cost > 0.01 && cost < 100) {
		t.Errorf("expiry cost %.2f µs per key; want 0.01 to 100", cost)
	}
	t.Logf("expiry: %.2f µs of Redis CPU per key", cost)
}

// TestMarkdownCPURows writes the "↳" row of each kind, with a goroutine
// count where no round handled a message.
func TestMarkdownCPURows(t *testing.T) {
	gap := [][]float64{{}, {2, 4, 6}}
	rep := &Report{Config: Config{Goroutines: []int{1, 8}, Rounds: 3, Duration: time.Second}}
	for _, r := range []*Row{
		{Name: "both", ServerCPURounds: gap, ClientCPURounds: [][]float64{{1}, {3}}},
		{Name: "redis", ServerCPURounds: gap, ClientCPURounds: [][]float64{{}, {}}},
		{Name: "client", ServerCPURounds: [][]float64{{}, {}}, ClientCPURounds: gap},
		{Name: "none", ServerCPURounds: [][]float64{{}, {}}, ClientCPURounds: [][]float64{{}, {}}},
	} {
		r.Rounds = [][]float64{{0}, {1}}
		rep.Rows = append(rep.Rows, r)
	}
	rep.summarize(nil)
	var md strings.Builder
	if err := rep.WriteMarkdown(&md, nil); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(md.String(), "\n") {
		if strings.HasPrefix(line, "| ↳") {
			got = append(got, strings.TrimRight(line, " |"))
		}
	}
	want := []string{
		"| ↳ CPU per message: Redis + client | – + 1.0 µs | 4.0 + 3.0 µs",
		"| ↳ Redis CPU per message | – | 4.0 µs",
		"| ↳ client CPU per message | – | 4.0 µs",
	}
	if !slices.Equal(got, want) {
		t.Errorf("CPU rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
