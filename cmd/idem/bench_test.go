package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemgo/idem/internal/testing/testenv"
)

// Bad flags and missing services are usage errors, said before any I/O:
// the addresses given point nowhere, so a run that tried them would fail
// differently (exit 2 after a timeout, with "cannot reach").
func TestBenchUsageErrors(t *testing.T) {
	t.Parallel()
	nowhere := map[string]string{envRedisAddr: "127.0.0.1:1", envClusterAddrs: "127.0.0.1:1", envPostgresDSN: "postgres://127.0.0.1:1/x"}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nowhere, []string{"bench", "--goroutines", "1,zero"}, "--goroutines"},
		{nowhere, []string{"bench", "--goroutines", "0"}, "--goroutines"},
		{nowhere, []string{"bench", "--groups", "redis,nosuch"}, `unknown group "nosuch"`},
		{nowhere, []string{"bench", "--rounds", "0"}, "--rounds"},
		{nowhere, []string{"bench", "--only", "("}, "--only"},
		{nowhere, []string{"bench", "extra"}, "unexpected argument"},
		{nil, []string{"bench", "--groups", "sql"}, "need --postgres"},
		{nil, []string{"bench", "--groups", "http"}, "need --redis"},
	} {
		r := runCLI(t, tc.env, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, "cannot reach") {
			t.Errorf("idem %q = %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
		r.wantOneLine(t, tc.args)
	}
	// An unreachable service is exit 2 too, with the service named.
	args := []string{"bench", "--groups", "http", "--redis", "127.0.0.1:1"}
	if r := runCLI(t, nil, args...); r.code != exitUsage || !strings.Contains(r.stderr, "cannot reach Redis") {
		t.Errorf("idem %q = %d, stderr %q; want 2, cannot reach Redis", args, r.code, r.stderr)
	}
}

// A tiny run of the http group on the real Redis writes the table to
// stdout and the same table and the chart into --out, and profiles when
// asked.
func TestBenchOut(t *testing.T) {
	t.Parallel()
	addr := testenv.Lookup(t, testenv.RedisAddrVar)
	dir := t.TempDir()
	args := []string{"bench", "--groups", "http", "--only", "bare|^middleware replay$", "--rounds", "1", "--duration", "50ms",
		"--goroutines", "2", "--cost-msgs", "20", "--out", dir, "--quiet",
		"--cpuprofile", filepath.Join(dir, "cpu.pprof"), "--memprofile", filepath.Join(dir, "mem.pprof")}
	r := runCLI(t, map[string]string{envRedisAddr: addr}, args...)
	if r.code != exitOK {
		t.Fatalf("idem %q = %d, stderr %q; want 0", args, r.code, r.stderr)
	}
	for _, want := range []string{"| **bare handler** |", "| **middleware replay** |", "| ÷ bare handler |"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "middleware first write |") {
		t.Errorf("stdout has a row --only excludes:\n%s", r.stdout)
	}
	table, err := os.ReadFile(filepath.Join(dir, benchTableFile))
	if err != nil || string(table) != r.stdout {
		t.Errorf("%s = %q, %v; want what stdout showed", benchTableFile, table, err)
	}
	svg, err := os.ReadFile(filepath.Join(dir, benchChartFile))
	if err != nil || !strings.HasPrefix(string(svg), "<svg") || strings.Count(string(svg), "<polyline") != 2 {
		t.Errorf("%s = %.80q…, %v; want an SVG with 2 lines", benchChartFile, svg, err)
	}
	for _, p := range []string{"cpu.pprof", "mem.pprof"} {
		if fi, err := os.Stat(filepath.Join(dir, p)); err != nil || fi.Size() == 0 {
			t.Errorf("profile %s: %v; want a non-empty file", p, err)
		}
	}
}
