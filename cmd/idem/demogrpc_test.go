package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// idem demo grpc says how to run the grpc module's demo, first with a
// command that works from a clone today: the module's @latest fails until
// it is published.
func TestDemoGRPCSaysWhereItIs(t *testing.T) {
	var out, errs bytes.Buffer
	code := run([]string{"demo", "grpc"}, &out, &errs)
	lines := strings.Split(errs.String(), "\n")
	if code != exitUsage || len(lines) < 2 || strings.TrimSpace(lines[1]) != "cd grpc && go run ./cmd/idem-grpc-demo [flags]" {
		t.Errorf("idem demo grpc = %d, stderr %q; want %d and, first, the command that runs the demo from a clone", code, &errs, exitUsage)
	}
	// The command's directory, from the clone's root (two levels up).
	if _, err := os.Stat(filepath.Join("..", "..", "grpc", "cmd", "idem-grpc-demo", "main.go")); err != nil {
		t.Errorf("the suggested command's program: %v", err)
	}
}
