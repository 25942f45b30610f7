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
	"crashes", "take-overs after crashes", "effects applied", "double effects",
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
	if got := field(t, r.stdout, "take-overs after crashes"); got != crashes {
		t.Errorf("take-overs = %d; want one per crash, %d", got, crashes)
	}
	if crashes == 0 || field(t, r.stdout, "duplicates skipped") == 0 {
		t.Errorf("a run of %d messages had no crash or no duplicate: the demo shows nothing\n%s", messages, r.stdout)
	}
	doubles, effects := field(t, r.stdout, "double effects"), field(t, r.stdout, "effects applied")
	if effects != messages+doubles {
		t.Errorf("effects applied = %d; want messages + double effects = %d", effects, messages+doubles)
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
// tests' leases are longer than the demo's 300ms: under -race, with every
// package's tests sharing the CPUs, a 300ms lease can run out while its
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
	}{
		{"double effect without a crash", func(l *ledger) {
			for i := range l.msgs {
				if l.msgs[i].crashAfter == 0 {
					l.msgs[i].applied++
					return
				}
			}
		}, "1 double effects without a crash"},
		{"message never applied", func(l *ledger) { l.msgs[3].applied = 0 }, "1 messages never took effect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"demo", "--messages", "100", "--crash-rate", "0"}
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

// The plan is a function of the seed alone.
func TestPlanFromSeed(t *testing.T) {
	t.Parallel()
	a, b := newPlan(500, 0.3, 0.1, 42), newPlan(500, 0.3, 0.1, 42)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("newPlan(seed 42) twice gave two plans")
	}
	if c := newPlan(500, 0.3, 0.1, 43); reflect.DeepEqual(a, c) {
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
