package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestDemo(t *testing.T) {
	var out, errs bytes.Buffer
	// The embedded Redis: the demo's default.
	t.Setenv("IDEM_REDIS_ADDR", "")
	code := run(context.Background(), []string{"--orders", "300", "--clients", "8", "--drop-rate", "0.2"}, &out, &errs)
	if code != 0 {
		t.Fatalf("run = %d; want 0\nstdout:\n%s\nstderr:\n%s", code, &out, &errs)
	}
	for _, want := range []string{
		"orders created twice or more                          0",
		"orders missing                                        0",
		"clients given their order's one response            300",
		"OK: with the key, 300 orders created once each",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, &out)
		}
	}
	if strings.Contains(out.String(), "created 0 orders twice") {
		t.Errorf("without the key, no order was created twice: the faults did not fire\n%s", &out)
	}
}

func TestDemoRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--orders", "0"}, {"--drop-rate", "0.9", "--reset-rate", "0.2"}, {"extra"}} {
		var out, errs bytes.Buffer
		if code := run(context.Background(), args, &out, &errs); code != 2 || errs.Len() == 0 {
			t.Errorf("run(%q) = %d, stderr %q; want 2 and a message", args, code, &errs)
		}
	}
}
