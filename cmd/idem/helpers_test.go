package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/sqlstore"
)

// result is what one run of the command left behind.
type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs the command with args in an environment of env only, so that
// the IDEM_* variables of the test process (set by `make test`) never pick a
// store behind a test's back.
func runCLI(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	return runWith(t, &cli{getenv: func(k string) string { return env[k] }}, args...)
}

func runWith(t *testing.T, c *cli, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	c.stdout, c.stderr = &out, &errb
	code := c.run(args)
	return result{code, out.String(), errb.String()}
}

// wantOneLine fails t unless stderr holds exactly one line.
func (r result) wantOneLine(t *testing.T, args []string) {
	t.Helper()
	if n := strings.Count(r.stderr, "\n"); n != 1 || !strings.HasPrefix(r.stderr, "idem") {
		t.Errorf("idem %q stderr = %q; want one line starting with \"idem\"", args, r.stderr)
	}
}

// sqliteFile returns the path of a new SQLite database holding the store's
// table, and a store on it with options o.
func sqliteFile(t *testing.T, o idem.Options) (string, *sqlstore.Store) {
	t.Helper()
	db, path := sqltest.SQLite(t)
	s, err := sqlstore.New(db, sqlstore.OptionsFrom(o, sqlstore.SQLite))
	if err != nil {
		t.Fatalf("sqlstore.New = %v", err)
	}
	if err := s.CreateSchema(context.Background()); err != nil {
		t.Fatalf("CreateSchema = %v", err)
	}
	return path, s
}

// confirm claims and confirms key in s with fingerprint fp and result res.
func confirm(t *testing.T, s idem.Store, key string, fp, res []byte) {
	t.Helper()
	ctx := context.Background()
	c, err := s.Claim(ctx, key, fp)
	if err != nil || c.Outcome != idem.Claimed {
		t.Fatalf("Claim(%q) = %v, %v; want claimed", key, c.Outcome, err)
	}
	if err := s.Confirm(ctx, c.Lease, res); err != nil {
		t.Fatalf("Confirm(%q) = %v", key, err)
	}
}
