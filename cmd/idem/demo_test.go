package main

import (
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/idemgo/idem/internal/testing/testenv"
)

// reportRows are the report's rows; each must appear in every report.
var reportRows = []string{
	"messages", "deliveries", "duplicates skipped", "in-progress redeliveries",
	"crashes", "take-overs after crashes", "take-overs seen", "effects reconciled", "effects applied", "double effects",
	"never applied", "records confirmed", "throughput",
}

// field returns the first number of the report row named name.
func field(t *testing.T, out, name string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(name) + ` +(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("report has no row %q:\n%s", name, out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// checkReport checks a successful demo's report against the guarantees it
// claims to have checked.
func checkReport(t *testing.T, r result, messages int) {
	t.Helper()
	if r.code != exitOK {
		t.Fatalf("demo exit = %d; want %d\nstdout:\n%s\nstderr:\n%s", r.code, exitOK, r.stdout, r.stderr)
	}
	for _, row := range reportRows {
		field(t, r.stdout, row)
	}
	crashes := field(t, r.stdout, "crashes")
	if got := field(t, r.stdout, "messages"); got != messages {
		t.Errorf("messages = %d; want %d", got, messages)
	}
	poison := 0
	if strings.Contains(r.stdout, "poison quarantined") {
		poison = field(t, r.stdout, "poison quarantined")
	}
	takeOvers := field(t, r.stdout, "take-overs after crashes")
	if takeOvers != crashes-poison {
		t.Errorf("take-overs = %d; want one per crash that left a claim to take over, %d", takeOvers, crashes-poison)
	}
	if got := field(t, r.stdout, "take-overs seen"); got != takeOvers {
		t.Errorf("take-overs seen by handlers = %d; want every take-over, %d", got, takeOvers)
	}
	if crashes == 0 || field(t, r.stdout, "duplicates skipped") == 0 {
		t.Errorf("a run of %d messages had no crash or no duplicate: the demo shows nothing\n%s", messages, r.stdout)
	}
	doubles, effects := field(t, r.stdout, "double effects"), field(t, r.stdout, "effects applied")
	if effects != messages+doubles {
		t.Errorf("effects applied = %d; want messages + double effects = %d", effects, messages+doubles)
	}
	reconciled := field(t, r.stdout, "effects reconciled")
	if reconciling := !strings.Contains(r.stdout, "--no-reconcile"); reconciling && (doubles != 0 || reconciled == 0) {
		t.Errorf("reconciling: %d double effects, %d effects reconciled; want 0 doubles, some reconciled\n%s", doubles, reconciled, r.stdout)
	} else if !reconciling && (reconciled != 0 || doubles == 0) {
		t.Errorf("--no-reconcile: %d double effects, %d effects reconciled; want some doubles, none reconciled\n%s", doubles, reconciled, r.stdout)
	}
	if !strings.Contains(r.stdout, "0 unexplained") || !strings.Contains(r.stdout, "\nOK: ") {
		t.Errorf("report does not say OK with 0 unexplained double effects:\n%s", r.stdout)
	}
	if got := field(t, r.stdout, "never applied"); got != 0 {
		t.Errorf("never applied = %d; want 0", got)
	}
	// The metrics table counts the wrapper's events: every duplicate
	// skipped is a message event with outcome duplicate.
	if !strings.Contains(r.stdout, "\nmetrics (") {
		t.Fatalf("report has no metrics table:\n%s", r.stdout)
	}
	if got, want := metricRow(t, r.stdout, "message", "duplicate", "-"), field(t, r.stdout, "duplicates skipped"); got != want {
		t.Errorf("metrics: message duplicate = %d; want duplicates skipped, %d", got, want)
	}
	if got := metricRow(t, r.stdout, "message", "claimed", "-"); got < messages {
		t.Errorf("metrics: message claimed = %d; want at least one per message, %d", got, messages)
	}
	if !strings.Contains(r.stdout, "records confirmed          "+strconv.Itoa(messages)+" of "+strconv.Itoa(messages)) {
		t.Errorf("not every record confirmed:\n%s", r.stdout)
	}
}

// A small run on the embedded Redis: every field reported, exit 0. The
// tests' leases are longer than the demo's 500ms: under -race, with every
// package's tests sharing the CPUs, a 500ms lease can run out while its
// handler runs, which the demo rightly reports as a failure.
func TestDemoEmbedded(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "demo", "--messages", "300", "--seed", "7", "--crash-rate", "0.05", "--lease", "1s")
	checkReport(t, r, 300)
	if !strings.Contains(r.stdout, "embedded Redis") {
		t.Errorf("report does not name the embedded store:\n%s", r.stdout)
	}
}

// The same demo on the real Redis (IDEM_REDIS_ADDR), found through the
// command's own environment variable.
func TestDemoRedis(t *testing.T) {
	t.Parallel()
	addr := testenv.Lookup(t, testenv.RedisAddrVar)
	r := runCLI(t, map[string]string{envRedisAddr: "redis://" + addr}, "demo", "--messages", "300", "--crash-rate", "0.05", "--lease", "1s")
	checkReport(t, r, 300)
	if !strings.Contains(r.stdout, "Redis at "+addr) {
		t.Errorf("report does not name the Redis at %s:\n%s", addr, r.stdout)
	}
}

// The same demo on the Redis Cluster (IDEM_REDIS_CLUSTER_ADDRS).
func TestDemoCluster(t *testing.T) {
	t.Parallel()
	addrs := testenv.Lookup(t, testenv.ClusterAddrsVar)
	r := runCLI(t, nil, "demo", "--cluster", addrs, "--messages", "300", "--crash-rate", "0.05", "--lease", "1s")
	checkReport(t, r, 300)
}

// The demo on SQLite: the table is created, the guarantees hold.
func TestDemoSQLite(t *testing.T) {
	t.Parallel()
	path := t.TempDir() + "/demo.db"
	r := runCLI(t, nil, "demo", "--sqlite", path, "--messages", "100", "--workers", "4", "--crash-rate", "0.1")
	checkReport(t, r, 100)
}

// A ledger that breaks a guarantee fails the demo with exit status 1 and
// says which guarantee broke.
func TestDemoBrokenLedger(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		fault func(*ledger)
		want  string
		flags []string
	}{
		{"double effect without a crash", func(l *ledger) {
			for i := range l.msgs {
				if l.msgs[i].crashAfter == 0 {
					l.msgs[i].applied++
					return
				}
			}
		}, "1 double effects without a crash", []string{"--no-reconcile"}},
		{"take-over not reported", func(l *ledger) { l.misreported++ }, "(1 reported wrongly)", nil},
		{"poison run once more", func(l *ledger) { l.msgs[len(l.msgs)-1].runs++ }, "1 poison messages not quarantined after exactly 4 crashed runs", []string{"--poison", "1"}},
		{"double effect though reconciling", func(l *ledger) {
			for i := range l.msgs {
				if l.msgs[i].crashAfter == 0 {
					l.msgs[i].applied++
					return
				}
			}
		}, "1 double effects, though every take-over asked the ledger first", nil},
		{"message never applied", func(l *ledger) { l.msgs[3].applied = 0 }, "1 messages never took effect", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"demo", "--messages", "100", "--crash-rate", "0"}, tt.flags...)
			r := runWith(t, &cli{getenv: func(string) string { return "" }, demoFault: tt.fault}, args...)
			if r.code != exitFailed {
				t.Errorf("demo with %s: exit = %d; want %d\n%s", tt.name, r.code, exitFailed, r.stdout)
			}
			if !strings.Contains(r.stdout, "FAILED") || !strings.Contains(r.stdout, tt.want) {
				t.Errorf("demo with %s: report lacks FAILED and %q:\n%s", tt.name, tt.want, r.stdout)
			}
		})
	}
}

// Poison messages crash every worker that takes them: each is quarantined
// after exactly MaxTakeOvers take-overs and dead-lettered, listed in the
// report, while every other message takes effect once; without
// reconciling, the same seed shows the double effects reconciling
// prevents. On the embedded Redis and on the real one.
func TestDemoPoisonAndNoReconcile(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"embedded", "redis"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var env map[string]string
			if name == "redis" {
				env = map[string]string{envRedisAddr: "redis://" + testenv.Lookup(t, testenv.RedisAddrVar)}
			}
			args := []string{"demo", "--messages", "300", "--seed", "7", "--crash-rate", "0.05", "--lease", "1s", "--poison", "2"}
			r := runCLI(t, env, args...)
			checkReport(t, r, 300)
			// Each key is listed, with the commands that settle it on a
			// store that outlives the demo; on the embedded one, which
			// ends with the demo, with a note saying so instead.
			mentions, note := 2*2, false
			if name == "embedded" {
				mentions, note = 2, true
			}
			if got := field(t, r.stdout, "poison quarantined"); got != 2 || !strings.Contains(r.stdout, "2 of 2 (each crashed its worker 4 times") ||
				strings.Count(r.stdout, ":poison-00") != mentions || strings.Contains(r.stdout, "the embedded store ends with the demo") != note {
				t.Errorf("poison quarantined = %d; want both listed, each after 4 crashed runs, %d mentions of their keys, a note on the embedded store %v:\n%s", got, mentions, note, r.stdout)
			}
			if got := metricRow(t, r.stdout, "message", "-", "quarantined"); got != 2 {
				t.Errorf("metrics: message quarantined = %d; want 2 (one delivery of each poison message)", got)
			}
			off := runCLI(t, env, append(args, "--no-reconcile")...)
			checkReport(t, off, 300)
			if a, b := field(t, r.stdout, "crashes"), field(t, off.stdout, "crashes"); a != b {
				t.Errorf("crashes %d reconciling, %d without; want the seed's same plan", a, b)
			}
			if a, b := field(t, r.stdout, "effects reconciled"), field(t, off.stdout, "double effects"); a < b {
				t.Errorf("%d effects reconciled, %d double effects without reconciling; want every double prevented", a, b)
			}
		})
	}
}

// The plan is a function of the seed alone.
func TestPlanFromSeed(t *testing.T) {
	t.Parallel()
	a, b := newPlan(500, 0, 0.3, 0.1, 42), newPlan(500, 0, 0.3, 0.1, 42)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("newPlan(seed 42) twice gave two plans")
	}
	if c := newPlan(500, 0, 0.3, 0.1, 43); reflect.DeepEqual(a, c) {
		t.Errorf("newPlan(seed 42) = newPlan(seed 43); want different plans")
	}
	seen := make([]int, 500)
	for _, m := range a.order {
		seen[m]++
	}
	for m, n := range seen {
		if n < 1 || n > 4 {
			t.Fatalf("message %d has %d copies in the queue; want 1 to 4", m, n)
		}
	}
}

// A run that does not finish in --timeout fails, and says so.
func TestDemoTimeout(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "demo", "--messages", "200", "--crash-rate", "0.5", "--lease", "5s", "--timeout", "300ms")
	if r.code != exitFailed || !strings.Contains(r.stdout, "FAILED: the run did not finish") || strings.Contains(r.stdout, "\nOK:") {
		t.Errorf("demo past its timeout = %d; want %d and FAILED, not OK:\n%s", r.code, exitFailed, r.stdout)
	}
}

// metricRow returns the count of the metrics table's row (op, outcome,
// error), 0 when there is none.
func metricRow(t *testing.T, out, op, outcome, class string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(op) + ` +` + regexp.QuoteMeta(outcome) + ` +` + regexp.QuoteMeta(class) + ` +(\d+)$`).FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// The ledger's judgement of a take-over report: told of an earlier run
// that crashed, or that stalled past its lease (still running, or done and
// confirming late), is right; told of a run that was never there or was
// taken over already, or not told after a crash, is wrong.
func TestLedgerTakeOverReports(t *testing.T) {
	l := newLedger(4)
	// 0: the run crashes; the next is told.
	l.begin(0, 1, false, 0)
	l.crashed(0, 1, crashBefore)
	l.begin(0, 2, true, 1)
	// 1: the run stalls past its lease; the next is told while it runs.
	l.begin(1, 3, false, 0)
	l.begin(1, 4, true, 3)
	// 2: the run's confirm lands late, after the next claimed and before
	// the next's handler began: still a stall.
	l.begin(2, 5, false, 0)
	l.settled(2, settledDone)
	l.begin(2, 6, true, 5)
	if c := l.snapshot(); c.takeOvers != 1 || c.stalls != 2 || c.seen != 3 || c.misreported != 0 {
		t.Fatalf("takeOvers %d, stalls %d, seen %d, misreported %d; want 1, 2, 3, 0", c.takeOvers, c.stalls, c.seen, c.misreported)
	}
	// 3: told of a run taken over already, told of a token never handed
	// out, then not told after a crash.
	l.begin(3, 7, false, 0)
	l.begin(3, 8, true, 7)
	l.begin(3, 9, true, 7)
	l.begin(3, 10, true, 99)
	l.crashed(3, 10, crashAfter)
	l.begin(3, 11, false, 0)
	if c := l.snapshot(); c.misreported != 3 {
		t.Errorf("misreported %d; want 3: a run taken over twice, an unknown token, a crash not told", c.misreported)
	}
}
