package idem

import (
	"bytes"
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testing/testenv"
)

// --- 3. Script cache lost ---------------------------------------------------

// TestRedisNoScript flushes Redis's script cache (as a restart or failover
// does): every call must still succeed, batches included.
func TestRedisNoScript(t *testing.T) {
	c := testenv.Redis(t)
	s := newTestRedisStore(t, c, RedisOptions{})
	ctx := context.Background()
	h := &tripCounter{}
	c.AddHook(h)
	flush := func() {
		t.Helper()
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
		h.take()
	}

	// Open the pipeline connection, whose setup the hook would count.
	if err := s.ConfirmBatch(ctx, claimAllOK(t, s, uuidKeys(2), nil), nil); err != nil {
		t.Fatalf("ConfirmBatch: %v", err)
	}
	flush()
	keys := uuidKeys(50)
	leases := claimAllOK(t, s, keys, nil)
	// The pipeline, SCRIPT LOAD of what it lost, the pipeline again: at
	// most 3.
	if n, sent := h.take(); n > 3 {
		t.Errorf("ClaimBatch after SCRIPT FLUSH cost %d round trips (%v); want at most 3", n, sent)
	}
	flush()
	if err := s.ConfirmBatch(ctx, leases, nil); err != nil {
		t.Fatalf("ConfirmBatch after SCRIPT FLUSH: %v", err)
	}
	flush()
	checkAllDuplicate(t, s, keys)

	key := uuid.NewString()
	flush()
	cl, err := s.Claim(ctx, key, nil)
	if err != nil || cl.Outcome != Claimed {
		t.Fatalf("Claim(%q) after SCRIPT FLUSH = %v, %v; want claimed", key, cl.Outcome, err)
	}
	for name, op := range map[string]func() error{
		"Renew":  func() error { return s.Renew(ctx, cl.Lease) },
		"Lookup": func() error { _, err := s.Lookup(ctx, key); return err },
	} {
		flush()
		if err := op(); err != nil {
			t.Errorf("%s(%q) after SCRIPT FLUSH: %v", name, key, err)
		}
	}
	flush()
	if err := s.Forget(ctx, cl.Lease); err != nil {
		t.Errorf("Forget(%q) after SCRIPT FLUSH: %v", key, err)
	}
	cl, err = s.Claim(ctx, key, nil)
	if err != nil || cl.Outcome != Claimed {
		t.Fatalf("Claim(%q) after Forget = %v, %v; want claimed", key, cl.Outcome, err)
	}
	flush()
	if err := s.Confirm(ctx, cl.Lease, []byte("r")); err != nil {
		t.Errorf("Confirm(%q) after SCRIPT FLUSH: %v", key, err)
	}
	flush()
	if d, err := s.Claim(ctx, key, nil); err != nil || d.Outcome != Duplicate {
		t.Errorf("Claim(%q) after SCRIPT FLUSH = %v, %v; want duplicate", key, d.Outcome, err)
	}
}

// TestRedisNoScriptQueuingClient runs the store on go-redis's asynchronous
// AutoPipeliner, whose Process queues a command and returns before its
// reply: a lost script cache, a missing key and a duplicate must still be
// told apart, from what the command holds once it has run.
func TestRedisNoScriptQueuingClient(t *testing.T) {
	c := testenv.Redis(t)
	ap, err := c.AsyncAutoPipeline()
	if err != nil {
		t.Fatalf("AsyncAutoPipeline: %v", err)
	}
	t.Cleanup(func() { _ = ap.Close() })
	prefix := testenv.UniquePrefix()
	s, err := NewRedisStore(ap, RedisOptions{Prefix: prefix})
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	ctx := context.Background()
	t.Cleanup(func() {
		if err := testenv.DeletePrefix(ctx, c, prefix); err != nil {
			t.Errorf("deleting the test's keys %s*: %v", prefix, err)
		}
	})
	key := uuid.NewString()
	if _, err := s.Lookup(ctx, key); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup(%q) of a new key = %v; want ErrNotFound", key, err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	cl, err := s.Claim(ctx, key, nil)
	if err != nil || cl.Outcome != Claimed {
		t.Fatalf("Claim(%q) after SCRIPT FLUSH = %v, %v; want claimed", key, cl.Outcome, err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	if err := s.Confirm(ctx, cl.Lease, []byte("r")); err != nil {
		t.Fatalf("Confirm(%q) after SCRIPT FLUSH: %v", key, err)
	}
	if d, err := s.Claim(ctx, key, nil); err != nil || d.Outcome != Duplicate || string(d.Record.Result) != "r" {
		t.Errorf("Claim(%q) after Confirm = %+v, %v; want duplicate with result \"r\"", key, d, err)
	}
}

func TestRedisNoScriptCluster(t *testing.T) {
	c := testenv.Cluster(t)
	s := newTestRedisStore(t, c, RedisOptions{})
	ctx := context.Background()
	trips, masters := hookMasters(t, c)
	flush := func() {
		t.Helper()
		if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.ScriptFlush(ctx).Err()
		}); err != nil {
			t.Fatalf("SCRIPT FLUSH on every master: %v", err)
		}
		trips.take()
	}
	flush()
	keys := uuidKeys(100)
	leases := claimAllOK(t, s, keys, nil)
	if got := trips.take(); len(got) != masters {
		t.Errorf("ClaimBatch reached %d masters (%v); want all %d", len(got), got, masters)
	}
	flush()
	if err := s.ConfirmBatch(ctx, leases, nil); err != nil {
		t.Fatalf("ConfirmBatch after SCRIPT FLUSH on every master: %v", err)
	}
	flush()
	checkAllDuplicate(t, s, keys)
}

// TestRedisClusterDeadMaster moves every slot from a dead master to the
// live cluster behind the client's back, as a failover does: a dead master
// never answers MOVED, and go-redis reloads its slot map by itself only
// every ClusterStateReloadInterval (60s). The store must reload it on the
// failed calls (issue 20), so that single calls, batches and AutoPipeline
// succeed again within a second, without the user calling ReloadState.
func TestRedisClusterDeadMaster(t *testing.T) {
	t.Parallel()
	real := testenv.Cluster(t)
	ctx := context.Background()
	shards, err := real.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SHARDS: %v", err)
	}
	var liveSlots []redis.ClusterSlot
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			if n.Role != "master" {
				continue
			}
			for _, r := range sh.Slots {
				liveSlots = append(liveSlots, redis.ClusterSlot{Start: int(r.Start), End: int(r.End),
					Nodes: []redis.ClusterNode{{Addr: net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))}}})
			}
		}
	}
	deadSlots := []redis.ClusterSlot{{Start: 0, End: 16383,
		Nodes: []redis.ClusterNode{{Addr: "127.0.0.1:" + testenv.FreePort(t)}}}}
	prefix := testenv.UniquePrefix()
	t.Cleanup(func() { _ = testenv.DeletePrefix(context.Background(), real, prefix) })
	for _, tc := range []struct {
		name string
		auto bool
		call func(s *RedisStore) error
	}{
		{"Claim", false, func(s *RedisStore) error { _, err := s.Claim(ctx, uuid.NewString(), nil); return err }},
		{"ClaimBatch", false, func(s *RedisStore) error { _, err := s.ClaimBatch(ctx, uuidKeys(10), nil); return err }},
		{"AutoPipeline", true, func(s *RedisStore) error {
			// Concurrent calls, so that some ride in a pipeline.
			errs := make(chan error, 8)
			for range 8 {
				go func() { _, err := s.Claim(ctx, uuid.NewString(), nil); errs <- err }()
			}
			var first error
			for range 8 {
				if err := <-errs; err != nil && first == nil {
					first = err
				}
			}
			return first
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var moved atomic.Bool
			c := redis.NewClusterClient(&redis.ClusterOptions{ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
				if moved.Load() {
					return liveSlots, nil
				}
				return deadSlots, nil
			}})
			t.Cleanup(func() { _ = c.Close() })
			// The dead master cannot tell its eviction policy; the first
			// contact is the calls' own.
			s, err := NewRedisStore(c, RedisOptions{Prefix: prefix, AllowEviction: true, NoAutoPipeline: !tc.auto})
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.call(s); err == nil {
				t.Fatalf("%s on a dead master = nil; want an error", tc.name)
			}
			moved.Store(true)
			// A call on its way to the dead master fails when go-redis
			// gives up dialing it (its retries take seconds); the one
			// after must find the new map.
			start := time.Now()
			for failed := 0; ; failed++ {
				err := tc.call(s)
				if err == nil {
					t.Logf("%s succeeded %v after the slots moved, after %d failed calls",
						tc.name, time.Since(start).Round(time.Millisecond), failed)
					return
				}
				if failed == 2 || time.Since(start) > 10*time.Second {
					t.Fatalf("%s failed %d times in %v after the slots moved off the dead master: %v; want the store to reload the slot map",
						tc.name, failed+1, time.Since(start).Round(time.Millisecond), err)
				}
			}
		})
	}
}

// replyErr is an error as Redis sends it.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// TestUnanswered pins which failures make a store reload a cluster's slot
// map: those that may mean the node is gone, not Redis's own answers.
func TestUnanswered(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{redis.Nil, false},
		{fmt.Errorf("idem: claim: %w", context.Canceled), false},
		{replyErr("ERR something"), false},
		{replyErr("MOVED 3999 127.0.0.1:7001"), false}, // go-redis reloads on MOVED itself
		{replyErr("CLUSTERDOWN The cluster is down"), true},
		{refused, true},
		{fmt.Errorf("idem: claim: %w", refused), true},
		{io.EOF, true},
		{context.DeadlineExceeded, true}, // a node that no longer answers at all
		{redis.ErrPoolTimeout, true},
	} {
		if got := unanswered(tc.err); got != tc.want {
			t.Errorf("unanswered(%v) = %v; want %v", tc.err, got, tc.want)
		}
	}
}

// --- 4. Bad input before any I/O --------------------------------------------

func TestRedisBadInputBeforeIO(t *testing.T) {
	t.Parallel()
	// A port nothing listens on.
	d := &testenv.LossyDialer{}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + testenv.FreePort(t), Dialer: d.Dial, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	h := &tripCounter{}
	c.AddHook(h)
	// AllowEviction: the constructor's only I/O is the eviction check.
	s, err := NewRedisStore(c, RedisOptions{AllowEviction: true, MaxKeyBytes: 16, MaxResultBytes: 8})
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	ctx := context.Background()
	lease := grantedLease(s, "k", 1, "w")
	long := strings.Repeat("k", 17)
	for _, tt := range []struct {
		name string
		op   func() error
		want error // nil: any error but a connection's
	}{
		{"Claim(empty)", func() error { _, err := s.Claim(ctx, "", nil); return err }, ErrInvalidKey},
		{"Claim(long)", func() error { _, err := s.Claim(ctx, long, nil); return err }, ErrInvalidKey},
		{"Claim(big fingerprint)", func() error {
			_, err := s.Claim(ctx, "k", make([]byte, MaxFingerprintBytes+1))
			return err
		}, ErrTooLarge},
		{"Lookup(empty)", func() error { _, err := s.Lookup(ctx, ""); return err }, ErrInvalidKey},
		{"Lookup(long)", func() error { _, err := s.Lookup(ctx, long); return err }, ErrInvalidKey},
		{"Confirm(big result)", func() error { return s.Confirm(ctx, lease, make([]byte, 9)) }, ErrTooLarge},
		{"Confirm(empty key)", func() error { return s.Confirm(ctx, grantedLease(s, "", 1, "w"), nil) }, ErrInvalidKey},
		{"Confirm(nil)", func() error { return s.Confirm(ctx, nil, nil) }, nil},
		{"Renew(nil)", func() error { return s.Renew(ctx, nil) }, nil},
		{"Forget(nil)", func() error { return s.Forget(ctx, nil) }, nil},
		{"Renew(long key)", func() error { return s.Renew(ctx, grantedLease(s, long, 1, "w")) }, ErrInvalidKey},
		{"Forget(empty key)", func() error { return s.Forget(ctx, grantedLease(s, "", 1, "w")) }, ErrInvalidKey},
		{"ClaimBatch(one empty)", func() error { _, err := s.ClaimBatch(ctx, []string{"a", ""}, nil); return err }, ErrInvalidKey},
		{"ClaimBatch(fingerprints short)", func() error {
			_, err := s.ClaimBatch(ctx, []string{"a", "b"}, [][]byte{nil})
			return err
		}, nil},
		{"ConfirmBatch(one big)", func() error {
			return s.ConfirmBatch(ctx, []*Lease{lease, lease}, [][]byte{nil, make([]byte, 9)})
		}, ErrTooLarge},
		{"ConfirmBatch(one nil)", func() error { return s.ConfirmBatch(ctx, []*Lease{lease, nil}, nil) }, nil},
	} {
		err := tt.op()
		switch {
		case err == nil:
			t.Errorf("%s = nil; want an error", tt.name)
		case tt.want != nil && !errors.Is(err, tt.want):
			t.Errorf("%s = %v; want %v", tt.name, err, tt.want)
		case strings.Contains(err.Error(), "refused") || strings.Contains(err.Error(), "dial"):
			t.Errorf("%s = %v; want an input error before any I/O", tt.name, err)
		}
	}
	if n, sent := h.take(); n != 0 {
		t.Errorf("bad input cost %d round trips (%v); want none", n, sent)
	}
	if d.Dials() != 0 {
		t.Errorf("bad input dialed Redis %d times; want never", d.Dials())
	}
	// The client really cannot reach Redis: good input fails on I/O.
	if _, err := s.Claim(ctx, "k", nil); err == nil {
		t.Errorf("Claim(%q) on a closed port = nil error; want a connection error", "k")
	}
}

// --- 5. Damaged records -----------------------------------------------------

// damagedRecords are values no release of idem writes.
var damagedRecords = []string{
	"garbage",
	"",
	"1",
	"179667091381781",        // a short confirmation's token, one digit short
	"17966709138178160",      // ... or one digit long
	"0796670913817816",       // ... or with a leading zero
	"1C12:5:ab",              // a length longer than the value
	"1C12:0:5:ab",            // ... the second one too
	"1C12:0:",                // a field missing
	"1C12:00x:",              // a length that is not a number
	"1Cx:0:0:0:",             // token not a number
	"1C-5:0:0:0:",            // negative token
	"1Dx:0:",                 // token not a number
	"1D12:5:ab",              // fingerprint longer than the value
	"1D12",                   // fields missing
	"1D:0:",                  // empty token
	"1D12:-1:",               // negative length
	"2D1:0:",                 // a later format version
	"2R12:5:ab",              // an operator's confirmation whose fingerprint is longer than the value
	"2R:0:",                  // ... or without a token
	"1X12:0:",                // unknown state
	"1F",                     // forgotten without a token
	"1Fx",                    // ... or with a bad one
	"1F-5",                   // ... or a negative one
	"1F0x10",                 // ... or one in hex
	"1Finf",                  // ... or an infinite one: the next token would be -2^63
	"1F99999999999999999999", // ... or one past int64: the same
	"\x00\xff{}%",            // binary
	strings.Repeat("1", 100),
}

func TestRedisDamagedRecords(t *testing.T) {
	for _, backend := range redisBackends {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			c := backend.client(t)
			var logs bytes.Buffer
			s := newTestRedisStore(t, c, RedisOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			for i, v := range damagedRecords {
				t.Run(strconv.Quote(v), func(t *testing.T) {
					checkDamaged(t, s, c, "damaged-"+strconv.Itoa(i), v)
				})
			}
			if !strings.Contains(logs.String(), "damaged record") {
				t.Errorf("log = %q; want the damaged records logged", logs.String())
			}
			if strings.Contains(logs.String(), "damaged-1") {
				t.Errorf("log = %q; want no raw key in it", logs.String())
			}
		})
	}
}

// checkDamaged stores value as key's record and checks that every
// operation on key answers ErrDamaged, leaves the value alone, and does not
// panic.
func checkDamaged(t *testing.T, s *RedisStore, c *redis.Client, key, value string) {
	t.Helper()
	ctx := context.Background()
	rk := s.redisKey(key)
	if err := c.Set(ctx, rk, value, time.Minute).Err(); err != nil {
		t.Fatalf("SET %q: %v", rk, err)
	}
	// Each operation gets a lease of its own: Forget's is forgotten.
	lease := func() *Lease { return grantedLease(s, key, 12, s.core.o.Worker) }
	for _, tt := range []struct {
		name string
		op   func() error
	}{
		{"Claim", func() error { _, err := s.Claim(ctx, key, nil); return err }},
		{"Renew", func() error { return s.Renew(ctx, lease()) }},
		{"Confirm", func() error { return s.Confirm(ctx, lease(), []byte("r")) }},
		{"Forget", func() error { return s.Forget(ctx, lease()) }},
		{"Lookup", func() error { _, err := s.Lookup(ctx, key); return err }},
		{"ClaimBatch", func() error { _, err := s.ClaimBatch(ctx, []string{key}, nil); return err }},
		{"ConfirmBatch", func() error { return s.ConfirmBatch(ctx, []*Lease{lease()}, nil) }},
		{"Resolve", func() error { return s.Resolve(ctx, key, Resolution{}) }},
		{"Resolve(Confirm)", func() error { return s.Resolve(ctx, key, Resolution{Confirm: true, Result: []byte("r")}) }},
	} {
		err := func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			return tt.op()
		}()
		if !errors.Is(err, ErrDamaged) {
			t.Errorf("%s(%q) on record %q = %v; want %v", tt.name, key, value, err, ErrDamaged)
		}
		if got, err := c.Get(ctx, rk).Result(); err != nil || got != value {
			t.Errorf("after %s(%q) the record is %q, %v; want it left as %q", tt.name, key, got, err, value)
			if err := c.Set(ctx, rk, value, time.Minute).Err(); err != nil {
				t.Fatalf("SET %q: %v", rk, err)
			}
		}
	}
	// The way out: an operator's forced forget clears it, and the key
	// works again.
	if err := s.Resolve(ctx, key, Resolution{Force: true}); err != nil {
		t.Errorf("Resolve(%q, Force) on record %q = %v; want nil, the record cleared", key, value, err)
	}
	if c, err := s.Claim(ctx, key, nil); err != nil || c.Outcome != Claimed {
		t.Errorf("Claim(%q) after Resolve(Force) cleared a damaged record = %v, %v; want Claimed", key, c.Outcome, err)
	}
}

// --- 2. Lost replies --------------------------------------------------------

// replyHook records the final reply of each EVALSHA/EVAL of one script, as
// the caller gets it after go-redis's retries.
type replyHook struct {
	sha     string
	mu      sync.Mutex
	replies []any
}

func (h *replyHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *replyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok && (cmd.Name() == "evalsha" || cmd.Name() == "eval") &&
			len(cmd.Args()) > 1 && cmd.Args()[1] == h.sha {
			h.mu.Lock()
			h.replies = append(h.replies, c.Val())
			h.mu.Unlock()
		}
		return err
	}
}

func (h *replyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *replyHook) take() []any {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.replies
	h.replies = nil
	return r
}

func TestRedisLostReply(t *testing.T) {
	for _, backend := range []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"miniredis", func(t *testing.T) string { m, _ := newMiniredisClient(t); return m.Addr() }},
		{"redis", func(t *testing.T) string { return testenv.Redis(t).Options().Addr }},
	} {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			d := &testenv.LossyDialer{}
			c := redis.NewClient(&redis.Options{Addr: backend.addr(t), Dialer: d.Dial})
			t.Cleanup(func() { _ = c.Close() })
			s := newTestRedisStore(t, c, RedisOptions{})
			ctx := context.Background()
			// Load the scripts, so that each attempt is one EVALSHA.
			warm, err := s.Claim(ctx, "warm-up", nil)
			if err != nil {
				t.Fatalf("Claim(%q): %v", "warm-up", err)
			}
			if err := s.Confirm(ctx, warm.Lease, nil); err != nil {
				t.Fatalf("Confirm(%q): %v", "warm-up", err)
			}
			wb, err := s.ClaimBatch(ctx, []string{"warm-up-batch"}, nil)
			if err != nil {
				t.Fatalf("ClaimBatch: %v", err)
			}
			if err := s.ConfirmBatch(ctx, []*Lease{wb[0].Lease}, nil); err != nil {
				t.Fatalf("ConfirmBatch: %v", err)
			}

			t.Run("claim", func(t *testing.T) {
				h := &replyHook{sha: claimScript.Hash()}
				c.AddHook(h)
				const key = "lost-claim-reply"
				// A new lease is answered with its token alone: $16, token.
				d.Arm(claimScript.Hash(), 2)
				cl, err := s.Claim(ctx, key, []byte("fp"))
				writes, lost, armed := d.Result()
				if armed {
					t.Fatalf("no claim script was sent on the lossy connection")
				}
				if err != nil || cl.Outcome != Claimed {
					t.Fatalf("Claim(%q) after a lost reply = %v, %v; want claimed", key, cl.Outcome, err)
				}
				if writes != 2 {
					t.Errorf("the claim script was sent %d times; want 2 (the lost attempt and go-redis's retry)", writes)
				}
				// The lost reply was a new lease; the retry must hand back
				// that very lease ('A'), not a second one nor InProgress.
				lostLines := strings.Split(lost, "\r\n")
				if len(lostLines) < 2 || lostLines[0] != "$16" {
					t.Fatalf("lost reply = %q; want the new lease's token", lost)
				}
				if tok := strconv.FormatInt(cl.Lease.Token, 10); lostLines[1] != tok {
					t.Errorf("Claim(%q) after a lost reply: token %s; want %s, the lost reply's", key, tok, lostLines[1])
				}
				if r := h.take(); len(r) != 1 || fmt.Sprint(r[0]) != fmt.Sprint([]any{"A", lostLines[1], r[0].([]any)[2]}) {
					t.Errorf("the retried claim script answered %v; want {A, %s, pttl}", r, lostLines[1])
				}
				again, err := s.Claim(ctx, key, []byte("fp"))
				if err != nil || again.Outcome != InProgress {
					t.Fatalf("second Claim(%q) = %v, %v; want in-progress", key, again.Outcome, err)
				}
				if again.Record.Token != cl.Lease.Token || again.Record.Owner != s.core.o.Worker {
					t.Errorf("second Claim(%q): holder token %d owner %q; want %d %q",
						key, again.Record.Token, again.Record.Owner, cl.Lease.Token, s.core.o.Worker)
				}
			})

			t.Run("batch", func(t *testing.T) {
				const n = 10
				keys := uuidKeys(n)
				// On one Redis the batch is one claim_batch.lua call:
				// an array header, then each new lease's bare token in 2
				// lines.
				d.Arm(claimBatchScript.Hash(), 1+2*n)
				cs, err := s.ClaimBatch(ctx, keys, nil)
				writes, lost, armed := d.Result()
				if armed {
					t.Fatalf("no claim pipeline was sent on the lossy connection")
				}
				if err != nil {
					t.Fatalf("ClaimBatch after a lost reply: %v", err)
				}
				if writes != 2 {
					t.Errorf("the claim pipeline was sent %d times; want 2", writes)
				}
				lostLines := strings.Split(lost, "\r\n")[1:]
				if len(lostLines) < 2*n {
					t.Fatalf("lost reply = %q; want %d claims", lost, n)
				}
				for i, c := range cs {
					if c.Outcome != Claimed {
						t.Errorf("ClaimBatch item %d after a lost reply = %v; want claimed", i, c.Outcome)
						continue
					}
					if tok := strconv.FormatInt(c.Lease.Token, 10); tok != lostLines[2*i+1] {
						t.Errorf("ClaimBatch item %d after a lost reply: token %s; want %s, the lost reply's", i, tok, lostLines[2*i+1])
					}
				}
				d.Arm(confirmBatchScript.Hash(), 1+n)
				leases := make([]*Lease, n)
				for i, c := range cs {
					leases[i] = c.Lease
				}
				if err := s.ConfirmBatch(ctx, leases, nil); err != nil {
					t.Fatalf("ConfirmBatch after a lost reply: %v", err)
				}
				if writes, lost, _ := d.Result(); writes != 2 || lost != fmt.Sprintf("*%d\r\n", n)+strings.Repeat(":1\r\n", n) {
					t.Errorf("confirm pipeline sent %d times, lost reply %q; want 2 and %d confirmations", writes, lost, n)
				}
				checkAllDuplicate(t, s, keys)
			})

			t.Run("confirm", func(t *testing.T) {
				h := &replyHook{sha: confirmScript.Hash()}
				c.AddHook(h)
				const key = "lost-confirm-reply"
				cl, err := s.Claim(ctx, key, []byte("fp"))
				if err != nil || cl.Outcome != Claimed {
					t.Fatalf("Claim(%q) = %v, %v; want claimed", key, cl.Outcome, err)
				}
				d.Arm(confirmScript.Hash(), 1)
				if err := s.Confirm(ctx, cl.Lease, []byte("result")); err != nil {
					t.Fatalf("Confirm(%q) after a lost reply: %v; want nil", key, err)
				}
				writes, lost, armed := d.Result()
				if armed || writes != 2 || lost != ":1\r\n" {
					t.Errorf("confirm script sent %d times, lost reply %q; want 2 and %q", writes, lost, ":1\r\n")
				}
				if r := h.take(); len(r) != 1 || r[0] != int64(3) {
					t.Errorf("the retried confirm script answered %v; want 3 (already confirmed by this lease)", r)
				}
				raw, err := c.Get(ctx, s.redisKey(key)).Result()
				if want := "1D" + strconv.FormatInt(cl.Lease.Token, 10) + ":2:fpresult"; err != nil || raw != want {
					t.Errorf("stored record = %q, %v; want %q", raw, err, want)
				}
				rec, err := s.Lookup(ctx, key)
				if err != nil || !rec.Confirmed || string(rec.Result) != "result" || rec.Token != cl.Lease.Token {
					t.Errorf("Lookup(%q) = %+v, %v; want confirmed once with result %q, token %d",
						key, rec, err, "result", cl.Lease.Token)
				}
			})
		})
	}
}

// grantedLease is a lease as s would grant it, for a test that needs one
// on a record it wrote by hand.
func grantedLease(s *RedisStore, key string, token int64, owner string) *Lease {
	l := s.core.Lease(key, token, time.Second, time.Now().Add(time.Second), nil)
	return l.regranted(key, token, owner)
}

// A lease belongs to the Redis records of its Prefix: another prefix's
// store, on the same Redis, refuses it before any write.
func TestRedisLeaseOfAnotherPrefix(t *testing.T) {
	_, c := newMiniredisClient(t)
	ctx := context.Background()
	a, err := NewRedisStore(c, RedisOptions{Prefix: "a:"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewRedisStore(c, RedisOptions{Prefix: "b:"})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := a.Claim(ctx, "k", nil)
	if err != nil || cl.Outcome != Claimed {
		t.Fatalf("Claim = %v, %v; want claimed", cl.Outcome, err)
	}
	if err := b.Confirm(ctx, cl.Lease, []byte("r")); !errors.Is(err, ErrInvalidLease) {
		t.Errorf("Confirm on Prefix b: of a lease of Prefix a: = %v; want ErrInvalidLease", err)
	}
	if n, err := c.Exists(ctx, b.redisKey("k")).Result(); err != nil || n != 0 {
		t.Errorf("after the refused Confirm, Prefix b: holds %d records (%v); want 0", n, err)
	}
	if err := a.Confirm(ctx, cl.Lease, []byte("r")); err != nil {
		t.Errorf("Confirm on its own store = %v; want nil", err)
	}
}

// Hash is the script's digest as Redis computes it, for tests that match
// commands by it. Only tests hash: the store takes SCRIPT LOAD's answer.
func (sc *luaScript) Hash() string {
	return fmt.Sprintf("%x", sha1.Sum([]byte(sc.src)))
}

// cutHook answers the script calls it sees, while armed, with a broken
// connection's error (no reply from Redis), as a dead master's callers get
// one.
type cutHook struct{ armed atomic.Bool }

var errCut = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}

func (h *cutHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cutHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() && cmd.Name() == "evalsha" {
			cmd.SetErr(errCut)
			return errCut
		}
		return next(ctx, cmd)
	}
}

func (h *cutHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.armed.Load() {
			for _, c := range cmds {
				c.SetErr(errCut)
			}
			return errCut
		}
		return next(ctx, cmds)
	}
}

// TestRedisClusterReloadsSlotsWhenUnanswered: a call that got no answer
// (a broken connection, a timeout: what a dead master's callers get) makes
// the store ask its ClusterClient for a new slot map, once per
// slotReloadGap at most; a reply from Redis does not. go-redis reloads by
// itself only on MOVED and ASK, which a dead master never sends: without
// the store's reload, its callers failed for 46 s after the replica's
// promotion (issue 20). Counted where go-redis asks for the map
// (ClusterOptions.ClusterSlots), with no node killed: nothing here
// depends on a failover's timing.
func TestRedisClusterReloadsSlotsWhenUnanswered(t *testing.T) {
	addrs := strings.Split(testenv.Lookup(t, testenv.ClusterAddrsVar), ",")
	seed := redis.NewClient(&redis.Options{Addr: addrs[0]})
	t.Cleanup(func() { _ = seed.Close() })
	var loads atomic.Int64
	for _, auto := range []bool{false, true} {
		t.Run(fmt.Sprintf("AutoPipeline %t", auto), func(t *testing.T) {
			cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: -1,
				ClusterSlots: func(ctx context.Context) ([]redis.ClusterSlot, error) {
					loads.Add(1)
					//lint:ignore SA1019 ClusterOptions.ClusterSlots wants CLUSTER SLOTS's answer
					return seed.ClusterSlots(ctx).Result()
				}})
			t.Cleanup(func() { _ = cc.Close() })
			cut := &cutHook{}
			cc.AddHook(cut)
			s := newTestRedisStore(t, cc, RedisOptions{NoAutoPipeline: !auto})
			ctx := context.Background()
			if _, err := s.Lookup(ctx, "first-contact"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Lookup = %v; want ErrNotFound", err)
			}
			// A reply from Redis (a damaged record's error is the store's
			// own; a missing key) asks for nothing.
			before := loads.Load()
			if _, err := s.Lookup(ctx, "absent"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Lookup = %v; want ErrNotFound", err)
			}
			time.Sleep(2 * slotReloadGap)
			if n := loads.Load() - before; n != 0 {
				t.Errorf("slot maps loaded after an answered call = %d; want 0", n)
			}
			cut.armed.Store(true)
			before = loads.Load()
			start := time.Now()
			for range 10 {
				if _, err := s.Lookup(ctx, "cut"); err == nil || errors.Is(err, ErrNotFound) {
					t.Fatalf("Lookup through a cut connection = %v; want its error", err)
				}
			}
			took := time.Since(start)
			deadline := time.Now().Add(10 * time.Second)
			for loads.Load() == before && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			cut.armed.Store(false)
			// One reload per slotReloadGap that the failures spanned, at
			// most (go-redis's own cooldown may fold two into one): a
			// slow machine makes the calls span more gaps, never fewer.
			most := 1 + int64(took/slotReloadGap)
			if n := loads.Load() - before; n < 1 || n > most {
				t.Errorf("slot maps loaded after 10 unanswered calls in %v = %d; want 1 to %d (the store asks go-redis to reload, once per %v)",
					took.Round(time.Millisecond), n, most, slotReloadGap)
			}
		})
	}
}
