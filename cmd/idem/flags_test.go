package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every command answers --help on stdout with exit 0.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"help"}, {"demo", "--help"}, {"serve", "-h"},
		{"inspect", "--help"}, {"prune", "--help"}, {"schema", "--help"}} {
		r := runCLI(t, nil, args...)
		if r.code != exitOK || !strings.Contains(r.stdout, "Usage: idem") || r.stderr != "" {
			t.Errorf("idem %q = %d stdout %q stderr %q; want 0 and usage on stdout", args, r.code, r.stdout, r.stderr)
		}
	}
	r := runCLI(t, nil, "demo", "--help")
	for _, env := range []string{envRedisAddr, envClusterAddrs, envPostgresDSN, envMySQLDSN, envSQLiteFile} {
		if !strings.Contains(r.stdout, env) {
			t.Errorf("demo --help does not document %s", env)
		}
	}
}

// Usage errors and unreachable stores: one line on stderr, exit 2.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"demo", "--no-such-flag"},
		{"demo", "--messages", "many"},
		{"demo", "--messages", "0"},
		{"demo", "--dup-rate", "1.5"},
		{"demo", "extra"},
		{"demo", "--redis", "redis://127.0.0.1:1", "--sqlite", "x.db"},
		{"demo", "--redis", "redis://127.0.0.1:1"},
		{"demo", "--redis", "mysql://nope"},
		{"serve", "--addr"},
		{"serve", "--lock-timeout", "0s"},
		{"inspect"},
		{"inspect", "a", "b", "--sqlite", "x.db"},
		{"inspect", "key"},
		{"inspect", "key", "--sqlite", "/nonexistent/idem.db"},
		{"inspect", "--hex", "zz", "--sqlite", "x.db"},
		{"prune"},
		{"prune", "--redis", "redis://127.0.0.1:1"},
		{"prune", "--postgres", "postgres://nobody@127.0.0.1:1/x?connect_timeout=2"},
		{"schema", "--dialect", "oracle"},
		{"schema", "--table", "bad name"},
	} {
		r := runCLI(t, nil, args...)
		if r.code != exitUsage {
			t.Errorf("idem %q = %d; want %d (stderr %q)", args, r.code, exitUsage, r.stderr)
		}
		if len(args) > 0 {
			r.wantOneLine(t, args)
		}
	}
}

// run, the entry point main calls, runs a command with the process's
// environment; a flag wins over its environment variable.
func TestRunEntryPoint(t *testing.T) {
	t.Setenv(envTable, "from_env")
	var out, errb strings.Builder
	if code := run([]string{"schema", "--dialect", "sqlite"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), `"from_env"`) {
		t.Errorf("run(schema) with %s=from_env = %d %q %q; want 0 and table from_env", envTable, code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"schema", "--dialect", "sqlite", "--table", "from_flag"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), `"from_flag"`) {
		t.Errorf("run(schema --table from_flag) = %d %q; want the flag to win over %s", code, out.String(), envTable)
	}
}

// The progress line is redrawn only on a terminal.
func TestIsTerminal(t *testing.T) {
	t.Parallel()
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(f) || isTerminal(&strings.Builder{}) {
		t.Errorf("isTerminal(a file or a buffer) = true; want false")
	}
}
