package idemotel_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemgo/idem"
	idemotel "github.com/idemgo/idem/otel"
)

// The alert rules and the Grafana dashboard of monitoring/ name the
// metrics as the OpenTelemetry Prometheus exporter exports them. These
// tests read the names from a real export, with every instrument
// recorded at least once, so that a renamed instrument or a typo in a
// rule or a panel fails here rather than in an empty graph.

// exported returns the metric names of a real export and, for each, its
// label names, with the series names Prometheus derives from a histogram
// (_bucket with le, _sum, _count).
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	obs, err := idemotel.New(idemotel.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))})
	if err != nil {
		t.Fatal(err)
	}
	recordEveryInstrument(t, obs)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]map[string]bool{}
	add := func(name string, labels map[string]bool) {
		if names[name] == nil {
			names[name] = map[string]bool{}
		}
		for l := range labels {
			names[name][l] = true
		}
	}
	for _, mf := range mfs {
		labels := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = true
			}
		}
		name := mf.GetName()
		if mf.GetType().String() == "HISTOGRAM" {
			add(name+"_sum", labels)
			add(name+"_count", labels)
			labels["le"] = true
			add(name+"_bucket", labels)
		}
		add(name, labels)
	}
	return names
}

// recordEveryInstrument makes obs record on each of its instruments: an
// operation of each outcome, a take-over, a quarantine, a late confirm, a
// lost lease, a cache hit and miss.
func recordEveryInstrument(t *testing.T, obs *idemotel.Observer) {
	t.Helper()
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	lapse := func() { mu.Lock(); now = now.Add(2 * time.Second); mu.Unlock() }
	s, err := idem.NewMemoryStoreClock(idem.Options{Observer: obs, LeaseTTL: time.Second, MaxTakeOvers: 1}, clock)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c1, _ := s.Claim(ctx, "crash", nil)
	lapse()
	c2, _ := s.Claim(ctx, "crash", nil) // a take-over
	if !c2.TakeOver {
		t.Fatalf("Claim after a lapse = %+v; want a take-over", c2)
	}
	if err := s.Renew(ctx, c1.Lease); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Renew of a lease taken over = %v; want ErrLeaseLost", err)
	}
	lapse()
	if _, err := s.Claim(ctx, "crash", nil); !errors.Is(err, idem.ErrQuarantined) {
		t.Fatalf("Claim after two lapses = %v; want ErrQuarantined", err)
	}
	late, _ := s.Claim(ctx, "late", nil)
	lapse()
	if err := s.Confirm(ctx, late.Lease, nil); err != nil {
		t.Fatalf("late Confirm = %v", err)
	}
	cache, err := idem.NewCache(s, idem.CacheOptions{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // a miss, then a hit
		if _, err := cache.Lookup(ctx, "late"); err != nil {
			t.Fatal(err)
		}
	}
}

var (
	metricRE = regexp.MustCompile(`\bidem_[a-z_]+`)
	// A label in a selector ({name="v"}) or a grouping (by (a, b)).
	matcherRE = regexp.MustCompile(`([a-z_]+)\s*(?:=~|!~|!=|=)\s*"`)
	groupRE   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// scrapeLabels are the labels Prometheus adds to every series it scrapes.
var scrapeLabels = map[string]bool{"job": true, "instance": true}

// unknownNames returns the metric names and labels of expr that the export
// does not have.
func unknownNames(expr string, names map[string]map[string]bool) []string {
	var bad []string
	labels := map[string]bool{}
	for _, n := range metricRE.FindAllString(expr, -1) {
		if names[n] == nil {
			bad = append(bad, "metric "+n)
			continue
		}
		for l := range names[n] {
			labels[l] = true
		}
	}
	var used []string
	for _, m := range matcherRE.FindAllStringSubmatch(expr, -1) {
		used = append(used, m[1])
	}
	for _, g := range groupRE.FindAllStringSubmatch(expr, -1) {
		for l := range strings.SplitSeq(g[1], ",") {
			used = append(used, strings.TrimSpace(l))
		}
	}
	for _, l := range used {
		if l != "" && !labels[l] && !scrapeLabels[l] {
			bad = append(bad, "label "+l)
		}
	}
	return bad
}

// dashboardExprs returns the PromQL of every panel of the dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	var out []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	if len(out) == 0 {
		t.Fatal("grafana-dashboard.json has no panel with a query")
	}
	return out
}

// alertExprs returns the expr of every rule of alerts.yml (block scalars
// included), read without a YAML library: the rules file is ours, and
// written in this one shape.
func alertExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("monitoring/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		rest, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "expr:")
		if !ok {
			continue
		}
		rest = strings.TrimSpace(rest)
		if rest == "|" {
			indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
			rest = ""
			for i+1 < len(lines) && len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " ")) > indent {
				i++
				rest += lines[i] + "\n"
			}
		}
		out = append(out, rest)
	}
	if len(out) == 0 {
		t.Fatal("alerts.yml has no expr")
	}
	return out
}

func TestDashboardAndAlertsNameExportedMetrics(t *testing.T) {
	names := exported(t)
	for _, want := range []string{"idem_operations_total", "idem_operation_duration_seconds_bucket", "idem_takeovers_total",
		"idem_late_confirms_total", "idem_quarantines_total", "idem_cache_keys_total"} {
		if names[want] == nil {
			t.Fatalf("the export lacks %s (doc.go lists it): got %v", want, slices.Sorted(func(y func(string) bool) {
				for n := range names {
					if !y(n) {
						return
					}
				}
			}))
		}
	}
	// The check itself finds a misspelt metric, and a misspelt label.
	if bad := unknownNames(`sum by (op) (rate(idem_operation_total[5m]))`, names); !slices.Contains(bad, "metric idem_operation_total") {
		t.Fatalf("unknownNames of a misspelt metric = %v; want it found", bad)
	}
	if bad := unknownNames(`sum by (opp) (rate(idem_operations_total{errorclass="store"}[5m]))`, names); !slices.Equal(bad, []string{"label errorclass", "label opp"}) {
		t.Fatalf("unknownNames of misspelt labels = %v; want both found", bad)
	}
	seen := map[string]bool{}
	for _, set := range [][]string{dashboardExprs(t), alertExprs(t)} {
		for _, e := range set {
			if bad := unknownNames(e, names); len(bad) > 0 {
				t.Errorf("query %q names what the otel module does not export: %v", e, bad)
			}
			for _, n := range metricRE.FindAllString(e, -1) {
				seen[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
			}
		}
	}
	// Every instrument is on the dashboard or in an alert.
	for _, n := range []string{"idem_operations_total", "idem_operation_duration_seconds", "idem_takeovers_total",
		"idem_late_confirms_total", "idem_quarantines_total", "idem_cache_keys_total"} {
		if !seen[n] {
			t.Errorf("%s is exported but on no panel and in no alert", n)
		}
	}
}

// TestAlertRules runs promtool's unit tests of the alert rules (Debian's
// prometheus package; .ci/services.sh install puts it there).
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not on PATH: under CI=true it is required (.ci/services.sh install)")
		}
		t.Skip("promtool is not on PATH (Debian: apt-get install prometheus); skipping the alert rules' tests")
	}
	cmd := exec.Command(promtool, "test", "rules", "alerts_test.yml")
	cmd.Dir = "monitoring"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool test rules = %v\n%s", err, out)
	}
	cmd = exec.Command(promtool, "check", "rules", "alerts.yml")
	cmd.Dir = "monitoring"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check rules = %v\n%s", err, out)
	}
}
