package idem

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
)

// A service starts before its Redis: NewRedisStore sends nothing, calls
// fail while the server is down, and work once it is up, with no restart
// of the store.
func TestRedisStartsBeforeItsServer(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	srv.Kill()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	io := &testenv.IOCounter{}
	c.AddHook(io)
	s, err := NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix()})
	if err != nil {
		t.Fatalf("NewRedisStore with its server down = %v; want a store (no I/O at construction)", err)
	}
	if n := io.N.Load(); n != 0 {
		t.Errorf("NewRedisStore sent %d commands; want none", n)
	}
	ctx := context.Background()
	if _, err := s.Claim(ctx, "k", nil); err == nil {
		t.Fatalf("Claim with the server down = nil error; want one")
	}
	if err := s.Check(ctx); err == nil {
		t.Errorf("Check with the server down = nil; want an error")
	}
	if !srv.Start() {
		t.FailNow()
	}
	if err := s.Check(ctx); err != nil {
		t.Errorf("Check once the server is up = %v; want nil", err)
	}
	if c, err := s.Claim(ctx, "k", nil); err != nil || c.Outcome != Claimed {
		t.Errorf("Claim once the server is up = %v, %v; want claimed", c.Outcome, err)
	}
}

// A Redis that persists nothing loses every record on a restart: accepted,
// with one warning however many checks run.
func TestRedisWarnsOnceWithoutPersistence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		args []string
		warn bool
	}{
		{"nothing", []string{"--appendonly", "no"}, true},
		{"aof", []string{"--appendonly", "yes"}, false},
		{"rdb", []string{"--appendonly", "no", "--save", "3600 1"}, false},
	} {
		srv := testenv.StartRedisServer(t, tt.args...)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		var logs bytes.Buffer
		s, err := NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix(), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := s.Check(ctx); err != nil {
				t.Fatalf("%s: Check = %v; want nil (persistence off is a warning)", tt.name, err)
			}
		}
		if _, err := s.Claim(ctx, "k", nil); err != nil {
			t.Fatalf("%s: Claim = %v", tt.name, err)
		}
		n := strings.Count(logs.String(), "persists nothing")
		if want := map[bool]int{true: 1, false: 0}[tt.warn]; n != want {
			t.Errorf("%s: %d persistence warnings in %q; want %d", tt.name, n, logs.String(), want)
		}
	}
}

// A finding stands: every call answers it, without a probe per call,
// until the server is fixed; then the calls go through with no restart.
func TestRedisFindingStandsUntilFixed(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t, "--maxmemory-policy", "allkeys-lru")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	io := &testenv.IOCounter{}
	c.AddHook(io)
	ctx := context.Background()
	s := newTestRedisStore(t, c, RedisOptions{})
	if _, err := s.Claim(ctx, "k", nil); !errors.Is(err, ErrEviction) {
		t.Fatalf("first Claim = %v; want ErrEviction", err)
	}
	before := io.N.Load()
	for range 50 {
		if _, err := s.Lookup(ctx, "k"); !errors.Is(err, ErrEviction) {
			t.Fatalf("Lookup = %v; want ErrEviction", err)
		}
	}
	if n := io.N.Load() - before; n > 5 {
		t.Errorf("50 calls against a standing finding sent %d commands; want the finding answered locally", n)
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(probeRetry + 50*time.Millisecond) // the finding's stand runs out
	if _, err := s.Claim(ctx, "k", nil); err != nil {
		t.Errorf("Claim after the server was fixed = %v; want nil", err)
	}
	// Passed: no command beyond the call itself (once its script is
	// loaded).
	if _, err := s.Lookup(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	before = io.N.Load()
	if _, err := s.Lookup(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if n := io.N.Load() - before; n != 1 {
		t.Errorf("a Lookup after the check passed sent %d commands; want 1", n)
	}
}

func TestRedisCheckZeroValue(t *testing.T) {
	if err := new(RedisStore).Check(context.Background()); err == nil || !strings.Contains(err.Error(), "NewRedisStore") {
		t.Errorf("Check on a zero RedisStore = %v; want an error naming NewRedisStore", err)
	}
}
