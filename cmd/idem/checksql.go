package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/sqlstore"
	"github.com/idemgo/idem/storetest"
)

// throwawayTable is the stem of idem check's own tables on a SQL server,
// named after table: table_check_XXXXXXXX, then _N per table.
func throwawayTable(table string) string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	return table + "_check_" + hex.EncodeToString(r[:])
}

// sqlChecker is one run of idem check on a SQL server (--postgres,
// --mysql): the same report as on Redis, each piece on throwaway tables
// that cleanup drops.
type sqlChecker struct {
	*cli
	b      *backend
	ops    int
	base   string
	seq    atomic.Int64
	mu     sync.Mutex
	tables []string // created, to drop
	failed []string
}

func (k *sqlChecker) verdict(name, verdict, detail string) {
	fmt.Fprintf(k.stdout, "%-13s %-5s %s\n", name, verdict, detail)
	if verdict == "FAIL" {
		k.failed = append(k.failed, name)
	}
}

func (k *sqlChecker) run(ctx context.Context) int {
	var version string
	if err := k.b.db.QueryRowContext(ctx, "SELECT version()").Scan(&version); err != nil {
		version = "version unknown: " + oneLine(err.Error())
	}
	fmt.Fprintf(k.stdout, "idem check: %s (%s), throwaway tables %s_N\n\n", k.b.desc, version, k.base)
	if k.probe(ctx) {
		k.conformance(ctx)
		k.perf(ctx)
	} else {
		k.verdict("conformance", "skip", "the probe failed: every call would fail as it did")
	}
	k.cleanup()
	if len(k.failed) > 0 {
		fmt.Fprintf(k.stdout, "\nidem check: FAIL (%s)\n", strings.Join(k.failed, ", "))
		return exitFailed
	}
	fmt.Fprintf(k.stdout, "\nidem check: PASS\n")
	return exitOK
}

// table creates a new throwaway table and returns its name.
func (k *sqlChecker) table(ctx context.Context) (string, error) {
	name := k.base + "_" + strconv.FormatInt(k.seq.Add(1), 10)
	s, err := sqlstore.New(k.b.db, sqlstore.Options{Dialect: k.b.dialect, Table: name})
	if err != nil {
		return "", err
	}
	k.mu.Lock()
	k.tables = append(k.tables, name) // dropped even if its creation half failed
	k.mu.Unlock()
	return name, s.CreateSchema(ctx)
}

// store opens a store on table with o.
func (k *sqlChecker) store(table string, o idem.Options) (*sqlstore.Store, error) {
	so := sqlstore.OptionsFrom(o, k.b.dialect)
	so.Table = table
	return sqlstore.New(k.b.db, so)
}

// probe creates a table with the store's DDL and makes one claim,
// confirmation and lookup in it: the statements every call relies on.
func (k *sqlChecker) probe(ctx context.Context) bool {
	table, err := k.table(ctx)
	if err == nil {
		var s *sqlstore.Store
		if s, err = k.store(table, idem.Options{Retention: checkRetention}); err == nil {
			err = roundTrip(ctx, s, "probe")
		}
	}
	if err != nil {
		k.verdict("probe", "FAIL", oneLine(err.Error()))
		return false
	}
	k.verdict("probe", "pass", "table created with sqlstore's DDL; Claim, Confirm and Lookup answer")
	return true
}

// roundTrip claims key, confirms it and reads the confirmation back.
func roundTrip(ctx context.Context, s idem.Store, key string) error {
	c, err := s.Claim(ctx, key, nil)
	if err == nil && c.Outcome != idem.Claimed {
		err = fmt.Errorf("Claim(%q) = %v; want claimed", key, c.Outcome)
	}
	if err == nil {
		err = s.Confirm(ctx, c.Lease, []byte("ok"))
	}
	if err != nil {
		return err
	}
	rec, err := s.Lookup(ctx, key)
	if err == nil && (!rec.Confirmed || string(rec.Result) != "ok") {
		err = fmt.Errorf("Lookup(%q) = %+v; want the confirmation", key, rec)
	}
	return err
}

// conformance runs the storetest suite, each check on a table of its own.
func (k *sqlChecker) conformance(ctx context.Context) {
	start := time.Now()
	results := storetest.Check(ctx, func(string) (storetest.Backend, error) {
		table, err := k.table(ctx)
		if err != nil {
			return storetest.Backend{}, err
		}
		return storetest.Backend{Open: func(o idem.Options) (idem.Store, error) { return k.store(table, o) }}, nil
	})
	report := checker{cli: k.cli}
	report.conformanceReport(results, start)
	k.failed = append(k.failed, report.failed...)
}

// perf times k.ops Claim+Confirm, one after another.
func (k *sqlChecker) perf(ctx context.Context) {
	table, err := k.table(ctx)
	var s *sqlstore.Store
	if err == nil {
		s, err = k.store(table, idem.Options{Retention: checkRetention})
	}
	if err != nil {
		k.verdict("latency", "FAIL", oneLine(err.Error()))
		return
	}
	lat := make([]time.Duration, 0, k.ops)
	start := time.Now()
	for i := range k.ops {
		t0 := time.Now()
		key := "k" + strconv.Itoa(i)
		c, err := s.Claim(ctx, key, nil)
		if err == nil && c.Outcome != idem.Claimed {
			err = fmt.Errorf("Claim(%q) = %v; want claimed", key, c.Outcome)
		}
		if err == nil {
			err = s.Confirm(ctx, c.Lease, nil)
		}
		if err != nil {
			k.verdict("latency", "FAIL", fmt.Sprintf("Claim+Confirm %d of %d: %s", i+1, k.ops, oneLine(err.Error())))
			return
		}
		lat = append(lat, time.Since(t0))
	}
	total := time.Since(start)
	k.verdict("latency", "pass", fmt.Sprintf("Claim+Confirm %s ms median, %s ms p99, %s ms mean (%d one after another)",
		ms(quantile(lat, 0.5)), ms(quantile(lat, 0.99)), ms(total/time.Duration(k.ops)), k.ops))
}

// cleanup drops the throwaway tables, in a context of its own: an
// interrupted check still cleans up.
func (k *sqlChecker) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := `"`
	if k.b.dialect == sqlstore.MySQL {
		q = "`"
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, t := range k.tables {
		if _, err := k.b.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+q+t+q); err != nil {
			k.verdict("cleanup", "warn", fmt.Sprintf("dropped %d of %d tables %s_N, then: %s", i, len(k.tables), k.base, oneLine(err.Error())))
			return
		}
	}
	k.verdict("cleanup", "pass", fmt.Sprintf("dropped %d tables %s_N", len(k.tables), k.base))
}
