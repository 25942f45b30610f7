package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestDemoGRPCSaysWhereItIs(t *testing.T) {
	var out, errs bytes.Buffer
	code := run([]string{"demo", "grpc"}, &out, &errs)
	if code != exitUsage || !strings.Contains(errs.String(), "go run github.com/idemgo/idem/grpc/cmd/idem-grpc-demo") {
		t.Errorf("idem demo grpc = %d, stderr %q; want %d and how to run the grpc module's demo", code, &errs, exitUsage)
	}
}
