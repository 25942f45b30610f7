package main

import (
	"strings"
	"testing"

	"github.com/idemgo/idem/internal/testing/testenv"
)

// checkHTTPReport checks an idem demo http report: the keyed run created
// every order once and gave every client its body; the unkeyed run shows
// the double effects the faults cause without the key.
func checkHTTPReport(t *testing.T, r result, orders int) {
	t.Helper()
	if r.code != exitOK || !strings.Contains(r.stdout, "\nOK: ") {
		t.Fatalf("demo http exit = %d; want %d\nstdout:\n%s\nstderr:\n%s", r.code, exitOK, r.stdout, r.stderr)
	}
	if got := field(t, r.stdout, "orders created once"); got != orders {
		t.Errorf("orders created once (with the key) = %d; want %d", got, orders)
	}
	for _, row := range []string{"orders created twice or more", "orders missing", "clients that gave up"} {
		if got := field(t, r.stdout, row); got != 0 {
			t.Errorf("%s (with the key) = %d; want 0", row, got)
		}
	}
	if got := field(t, r.stdout, "clients given their order's one body"); got != orders {
		t.Errorf("clients given their order's one body = %d; want %d", got, orders)
	}
	if field(t, r.stdout, "responses lost after the handler ran") == 0 || field(t, r.stdout, "replayed responses") == 0 {
		t.Errorf("no response lost or replayed: the demo shows nothing\n%s", r.stdout)
	}
}

func TestDemoHTTPEmbedded(t *testing.T) {
	args := []string{"demo", "http", "--orders", "300", "--clients", "8", "--drop-rate", "0.2", "--reset-rate", "0.05"}
	checkHTTPReport(t, runCLI(t, nil, args...), 300)
}

func TestDemoHTTPRedis(t *testing.T) {
	addr := testenv.Lookup(t, testenv.RedisAddrVar)
	args := []string{"demo", "http", "--redis", "redis://" + addr, "--prefix", "idem-demo-http-test:", "--orders", "300", "--clients", "8", "--drop-rate", "0.2"}
	checkHTTPReport(t, runCLI(t, nil, args...), 300)
}

func TestDemoHTTPFlags(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "http", "--orders", "0"},
		{"demo", "http", "--drop-rate", "0.9", "--reset-rate", "0.2"},
		{"demo", "http", "extra"},
	} {
		r := runCLI(t, nil, args...)
		if r.code != exitUsage {
			t.Errorf("idem %q = %d; want %d", args, r.code, exitUsage)
		}
		r.wantOneLine(t, args)
	}
}
