package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/sqlstore"
)

// consoleBenchKeys is how many quarantined keys the console's pages are
// measured on (issue 45: each page in ≤ 50 ms for 1,000).
const consoleBenchKeys = 1000

// quarantineMany quarantines n keys on s (LeaseTTL MinLeaseTTL,
// MaxTakeOvers 1): each is claimed, taken over and quarantined, in
// batches of concurrent claims.
func quarantineMany(b *testing.B, s idem.Store, n int) []string {
	b.Helper()
	ctx := context.Background()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench-%06d", i)
	}
	claimAll := func(want func(error) bool) {
		errc := make(chan error, n)
		sem := make(chan struct{}, 32)
		for _, k := range keys {
			sem <- struct{}{}
			go func() {
				defer func() { <-sem }()
				_, err := s.Claim(ctx, k, nil)
				if !want(err) {
					errc <- fmt.Errorf("Claim(%q) = %v", k, err)
				}
			}()
		}
		for range cap(sem) {
			sem <- struct{}{}
		}
		close(errc)
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	claimAll(func(err error) bool { return err == nil })
	time.Sleep(idem.MinLeaseTTL + 50*time.Millisecond)
	claimAll(func(err error) bool { return err == nil })
	time.Sleep(idem.MinLeaseTTL + 50*time.Millisecond)
	claimAll(func(err error) bool { return errors.Is(err, idem.ErrQuarantined) })
	return keys
}

// BenchmarkConsolePages measures the console's pages, each served whole
// (store reads and template) through its handler, on a store holding
// 1,000 quarantined keys: the list (the first 200, as by default; all
// 1,000 on one page), one key, the live view, and one live sample, on real Redis and Postgres (IDEM_REDIS_ADDR,
// IDEM_POSTGRES_DSN).
func BenchmarkConsolePages(b *testing.B) {
	stores := map[string]func(b *testing.B) (idem.Store, liveCounter){
		"redis": func(b *testing.B) (idem.Store, liveCounter) {
			addr := os.Getenv(envRedisAddr)
			if addr == "" {
				b.Skip("IDEM_REDIS_ADDR is not set")
			}
			c := redis.NewClient(&redis.Options{Addr: addr})
			b.Cleanup(func() { _ = c.Close() })
			prefix := fmt.Sprintf("consolebench:%d:", time.Now().UnixNano())
			s, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix, LeaseTTL: idem.MinLeaseTTL, MaxTakeOvers: 1, Retention: 10 * time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			return s, &redisCounter{c: c, prefix: prefix, max: 20000}
		},
		"postgres": func(b *testing.B) (idem.Store, liveCounter) {
			dsn := os.Getenv(envPostgresDSN)
			if dsn == "" {
				b.Skip("IDEM_POSTGRES_DSN is not set")
			}
			db, err := sql.Open(postgresDriver, dsn)
			if err != nil {
				b.Fatal(err)
			}
			table := fmt.Sprintf("consolebench_%d", time.Now().UnixNano())
			b.Cleanup(func() {
				_, _ = db.Exec("DROP TABLE IF EXISTS " + table)
				_ = db.Close()
			})
			s, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: table, LeaseTTL: idem.MinLeaseTTL, MaxTakeOvers: 1})
			if err != nil {
				b.Fatal(err)
			}
			if err := s.CreateSchema(context.Background()); err != nil {
				b.Fatal(err)
			}
			return s, newSQLCounter(db, sqlstore.Postgres, table)
		},
	}
	for _, name := range []string{"redis", "postgres"} {
		b.Run(name, func(b *testing.B) {
			s, counter := stores[name](b)
			keys := quarantineMany(b, s, consoleBenchKeys)
			live := newLiveView(counter, time.Second, time.Minute)
			live.sample(context.Background())
			newCon := func(limit int) *console {
				con, err := newConsole(consoleConfig{Store: s, Desc: name, Tokens: map[string]string{"benchmark-token-123": "bench"},
					Limit: limit, Live: live, Log: &strings.Builder{}})
				if err != nil {
					b.Fatal(err)
				}
				return con
			}
			// The list as idem console shows it (--limit 200, its
			// default: the first 200 of the 1,000), and all 1,000 on one
			// page (--limit 1000).
			con, all := newCon(200), newCon(consoleBenchKeys)
			get := func(b *testing.B, con *console, path, want string) {
				r := httptest.NewRequest(http.MethodGet, path, nil)
				r.Header.Set("Authorization", "Bearer benchmark-token-123")
				w := httptest.NewRecorder()
				con.ServeHTTP(w, r)
				if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), want) {
					b.Fatalf("GET %s = %d; want 200 with %q", path, w.Code, want)
				}
			}
			pages := []struct {
				name       string
				con        *console
				path, want string
			}{
				{"list", con, "/", "the first 200"},
				{"list-all", all, "/", fmt.Sprintf("%d quarantined keys", consoleBenchKeys)},
				{"key", con, "/key/" + con.keyID(keys[len(keys)/2]), "quarantined"},
				{"live", con, "/live", "round-trip time"},
				{"sample", nil, "", ""}, // one live sample: what each refresh costs the store
			}
			for _, p := range pages {
				b.Run(p.name, func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						if p.path == "" {
							if s := live.sample(context.Background()); s.Err != "" || s.Quarantined != consoleBenchKeys {
								b.Fatalf("sample = %+v; want %d quarantined", s, consoleBenchKeys)
							}
							continue
						}
						get(b, p.con, p.path, p.want)
					}
					b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/page")
				})
			}
		})
	}
}
