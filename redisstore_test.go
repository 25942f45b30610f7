package idem

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
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

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
)

// Tests of what is specific to RedisStore: round trips, lost replies, the
// script cache, damaged records, the eviction check, memory. What every
// store must do is storetest's.

// redisTestPrefix returns a Redis key prefix no other test uses, so that tests
// can share one Redis (and run beside other packages' tests on it).
func redisTestPrefix(t testing.TB) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "idemtest:" + hex.EncodeToString(b[:]) + ":"
}

// newTestRedisStore returns a store on c under a fresh prefix (unless o
// names one) and deletes the prefix's keys when t ends.
func newTestRedisStore(t testing.TB, c redis.UniversalClient, o RedisOptions) *RedisStore {
	t.Helper()
	if o.Prefix == "" {
		o.Prefix = redisTestPrefix(t)
	}
	s, err := NewRedisStore(c, o)
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	t.Cleanup(func() {
		if err := deleteRedisPrefix(context.Background(), c, o.Prefix); err != nil {
			t.Errorf("deleting the test's keys %s*: %v", o.Prefix, err)
		}
	})
	return s
}

// deleteRedisPrefix unlinks every key that begins with prefix, on every master of
// a cluster. prefix must hold no glob characters.
func deleteRedisPrefix(ctx context.Context, c redis.UniversalClient, prefix string) error {
	del := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
			if len(keys) == 1000 {
				if err := c.Unlink(ctx, keys...).Err(); err != nil {
					return err
				}
				keys = keys[:0]
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		if len(keys) > 0 {
			// One by one: on a cluster the keys are in different slots.
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.Unlink(ctx, k)
				}
				return nil
			})
			return err
		}
		return nil
	}
	switch c := c.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, del)
	case *redis.Client:
		return del(ctx, c)
	}
	return fmt.Errorf("deleteRedisPrefix: unexpected client %T", c)
}

// newMiniredisClient returns a client of an in-process miniredis.
func newMiniredisClient(t testing.TB) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return m, c
}

// tripCounter is a go-redis hook that counts round trips: one per command
// sent alone, one per pipeline.
type tripCounter struct {
	mu    sync.Mutex
	trips int
	sent  []string // what each round trip carried, for failure messages
}

func (h *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd.Name())
		return next(ctx, cmd)
	}
}

func (h *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count(fmt.Sprintf("pipeline of %d %s", len(cmds), cmdNames(cmds)))
		return next(ctx, cmds)
	}
}

func cmdNames(cmds []redis.Cmder) string {
	names := map[string]bool{}
	for _, c := range cmds {
		names[c.Name()] = true
	}
	var s []string
	for n := range names {
		s = append(s, n)
	}
	return strings.Join(s, ",")
}

func (h *tripCounter) count(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trips++
	h.sent = append(h.sent, what)
}

// take returns the round trips counted since the last take, and what they
// carried.
func (h *tripCounter) take() (int, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, sent := h.trips, h.sent
	h.trips, h.sent = 0, nil
	return n, sent
}

// uuidKeys returns n fresh UUID strings: 36-byte keys, like message ids.
func uuidKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = uuid.NewString()
	}
	return keys
}

// claimAllOK claims keys in one batch and fails t unless every one is Claimed.
func claimAllOK(t testing.TB, s *RedisStore, keys []string, fps [][]byte) []*Lease {
	t.Helper()
	cs, err := s.ClaimBatch(context.Background(), keys, fps)
	if err != nil {
		t.Fatalf("ClaimBatch(%d keys): %v", len(keys), err)
	}
	leases := make([]*Lease, len(cs))
	for i, c := range cs {
		if c.Outcome != Claimed {
			t.Fatalf("ClaimBatch: item %d (%q) = %v; want claimed", i, keys[i], c.Outcome)
		}
		leases[i] = c.Lease
	}
	return leases
}

// checkAllDuplicate fails t unless every key is Duplicate in one batch.
func checkAllDuplicate(t testing.TB, s *RedisStore, keys []string) {
	t.Helper()
	cs, err := s.ClaimBatch(context.Background(), keys, nil)
	if err != nil {
		t.Fatalf("ClaimBatch(%d confirmed keys): %v", len(keys), err)
	}
	for i, c := range cs {
		if c.Outcome != Duplicate {
			t.Fatalf("ClaimBatch: confirmed item %d (%q) = %v; want duplicate", i, keys[i], c.Outcome)
		}
	}
}

// --- 1. Round trips ---------------------------------------------------------

func TestRedisRoundTrips(t *testing.T) {
	for _, backend := range []struct {
		name   string
		client func(t *testing.T) *redis.Client
	}{
		{"miniredis", func(t *testing.T) *redis.Client { _, c := newMiniredisClient(t); return c }},
		{"redis", func(t *testing.T) *redis.Client { return testenv.Redis(t) }},
	} {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			c := backend.client(t)
			s := newTestRedisStore(t, c, RedisOptions{})
			ctx := context.Background()
			h := &tripCounter{}
			c.AddHook(h)

			// Warm up: load every script and open the connections.
			for _, k := range uuidKeys(2) {
				cl, err := s.Claim(ctx, k, nil)
				if err != nil {
					t.Fatalf("Claim(%q): %v", k, err)
				}
				if err := s.Confirm(ctx, cl.Lease, nil); err != nil {
					t.Fatalf("Confirm(%q): %v", k, err)
				}
			}
			if err := s.ConfirmBatch(ctx, claimAllOK(t, s, uuidKeys(100), nil), nil); err != nil {
				t.Fatalf("ConfirmBatch: %v", err)
			}
			h.take()

			const n = 20
			for _, k := range uuidKeys(n) {
				cl, err := s.Claim(ctx, k, []byte("fp"))
				if err != nil || cl.Outcome != Claimed {
					t.Fatalf("Claim(%q) = %v, %v; want claimed", k, cl.Outcome, err)
				}
				if err := s.Confirm(ctx, cl.Lease, []byte("ok")); err != nil {
					t.Fatalf("Confirm(%q): %v", k, err)
				}
			}
			if got, sent := h.take(); got != 2*n {
				t.Errorf("%d Claim+Confirm cost %d round trips (%v); want %d", n, got, sent, 2*n)
			}

			keys := uuidKeys(100)
			leases := claimAllOK(t, s, keys, nil)
			if got, sent := h.take(); got != 1 {
				t.Errorf("ClaimBatch of %d cost %d round trips (%v); want 1", len(keys), got, sent)
			}
			if err := s.ConfirmBatch(ctx, leases, nil); err != nil {
				t.Fatalf("ConfirmBatch: %v", err)
			}
			if got, sent := h.take(); got != 1 {
				t.Errorf("ConfirmBatch of %d cost %d round trips (%v); want 1", len(keys), got, sent)
			}
			checkAllDuplicate(t, s, keys)
		})
	}
}

// nodeTrips counts the round trips that carry a script, per cluster node.
type nodeTrips struct {
	mu     sync.Mutex
	byNode map[string]int
}

type nodeHook struct {
	addr string
	n    *nodeTrips
}

func (h nodeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h nodeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (h nodeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count(cmds)
		return next(ctx, cmds)
	}
}

// count counts one round trip to the node if it runs a script: the cluster
// client also talks to nodes on its own (CLUSTER SLOTS), which is not ours.
func (h nodeHook) count(cmds []redis.Cmder) {
	for _, c := range cmds {
		if n := c.Name(); n == "evalsha" || n == "eval" {
			h.n.mu.Lock()
			h.n.byNode[h.addr]++
			h.n.mu.Unlock()
			return
		}
	}
}

func (n *nodeTrips) take() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.byNode
	n.byNode = map[string]int{}
	return m
}

// hookMasters counts script round trips on each master of c. A
// ClusterClient pipeline is split by node and each part runs through that
// node client's pipeline hook, so the node clients' hooks see what reaches
// each master.
func hookMasters(t *testing.T, c *redis.ClusterClient) (*nodeTrips, int) {
	t.Helper()
	n := &nodeTrips{byNode: map[string]int{}}
	var masters atomic.Int32
	err := c.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		m.AddHook(nodeHook{addr: m.Options().Addr, n: n})
		masters.Add(1)
		return nil
	})
	if err != nil {
		t.Fatalf("ForEachMaster: %v", err)
	}
	return n, int(masters.Load())
}

func TestRedisRoundTripsCluster(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t)
	s := newTestRedisStore(t, c, RedisOptions{})
	ctx := context.Background()
	trips, masters := hookMasters(t, c)
	if masters < 2 {
		t.Fatalf("the cluster has %d masters; want several to spread a batch over", masters)
	}

	// Warm up: load the scripts on every master.
	if err := s.ConfirmBatch(ctx, claimAllOK(t, s, uuidKeys(100), nil), nil); err != nil {
		t.Fatalf("ConfirmBatch: %v", err)
	}
	trips.take()

	check := func(call string, got map[string]int) {
		t.Helper()
		if len(got) != masters {
			t.Errorf("%s of 100 keys reached %d masters (%v); want all %d", call, len(got), got, masters)
		}
		for node, n := range got {
			if n != 1 {
				t.Errorf("%s of 100 keys cost %d round trips to %s (%v); want 1 per master", call, n, node, got)
			}
		}
	}
	keys := uuidKeys(100)
	leases := claimAllOK(t, s, keys, nil)
	check("ClaimBatch", trips.take())
	if err := s.ConfirmBatch(ctx, leases, nil); err != nil {
		t.Fatalf("ConfirmBatch: %v", err)
	}
	check("ConfirmBatch", trips.take())
	checkAllDuplicate(t, s, keys)
}

// --- 2. Lost replies --------------------------------------------------------

// lossyDialer dials real connections that can lose one reply: once armed,
// the first connection that writes a command containing the armed pattern
// reads the reply for real (so the server has run the command), throws it
// away, closes the connection and returns io.EOF, an error go-redis retries
// on a new connection (shouldRetry).
type lossyDialer struct {
	mu      sync.Mutex
	pattern []byte // counted in every write; nil: nothing counted
	armed   bool   // the next matching write loses its reply
	lines   int    // CRLF-terminated lines in the reply to read before dropping it
	writes  int    // writes that carried pattern
	lost    []byte // the reply that was thrown away
	dials   int
}

func (d *lossyDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.dials++
	d.mu.Unlock()
	return &lossyConn{Conn: c, d: d}, nil
}

// arm makes the next command containing pattern lose a reply of lines lines.
func (d *lossyDialer) arm(pattern string, lines int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pattern, d.armed, d.lines, d.writes, d.lost = []byte(pattern), true, lines, 0, nil
}

func (d *lossyDialer) result() (writes int, lost string, stillArmed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.writes, string(d.lost), d.armed
}

type lossyConn struct {
	net.Conn
	d     *lossyDialer
	lines atomic.Int32 // >0: lose the next reply, of this many lines
}

func (c *lossyConn) Write(p []byte) (int, error) {
	d := c.d
	d.mu.Lock()
	if d.pattern != nil && bytes.Contains(p, d.pattern) {
		d.writes++
		if d.armed {
			d.armed = false
			c.lines.Store(int32(d.lines))
		}
	}
	d.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *lossyConn) Read(p []byte) (int, error) {
	lines := int(c.lines.Swap(0))
	if lines == 0 {
		return c.Conn.Read(p)
	}
	// Read the whole reply first: the server has run the command and
	// answered, and only then is the answer lost.
	var reply []byte
	buf := make([]byte, 512)
	_ = c.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for bytes.Count(reply, []byte("\r\n")) < lines {
		n, err := c.Conn.Read(buf)
		reply = append(reply, buf[:n]...)
		if err != nil {
			break
		}
	}
	c.d.mu.Lock()
	c.d.lost = reply
	c.d.mu.Unlock()
	_ = c.Conn.Close()
	return 0, io.EOF
}

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
			d := &lossyDialer{}
			c := redis.NewClient(&redis.Options{Addr: backend.addr(t), Dialer: d.dial})
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
				// Reply {'C', token}: *2, $1, C, $16, token.
				d.arm(claimScript.Hash(), 5)
				cl, err := s.Claim(ctx, key, []byte("fp"))
				writes, lost, armed := d.result()
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
				if len(lostLines) < 5 || lostLines[2] != "C" {
					t.Fatalf("lost reply = %q; want the claim's {'C', token}", lost)
				}
				if tok := strconv.FormatInt(cl.Lease.Token, 10); lostLines[4] != tok {
					t.Errorf("Claim(%q) after a lost reply: token %s; want %s, the lost reply's", key, tok, lostLines[4])
				}
				if r := h.take(); len(r) != 1 || fmt.Sprint(r[0]) != fmt.Sprint([]any{"A", lostLines[4], r[0].([]any)[2]}) {
					t.Errorf("the retried claim script answered %v; want {A, %s, pttl}", r, lostLines[4])
				}
				again, err := s.Claim(ctx, key, []byte("fp"))
				if err != nil || again.Outcome != InProgress {
					t.Fatalf("second Claim(%q) = %v, %v; want in-progress", key, again.Outcome, err)
				}
				if again.Record.Token != cl.Lease.Token || again.Record.Owner != s.o.Worker {
					t.Errorf("second Claim(%q): holder token %d owner %q; want %d %q",
						key, again.Record.Token, again.Record.Owner, cl.Lease.Token, s.o.Worker)
				}
			})

			t.Run("batch", func(t *testing.T) {
				const n = 10
				keys := uuidKeys(n)
				// On one Redis the batch is one claim_batch.lua call:
				// an array header, then each reply {'C', token} in 5 lines.
				d.arm(claimBatchScript.Hash(), 1+5*n)
				cs, err := s.ClaimBatch(ctx, keys, nil)
				writes, lost, armed := d.result()
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
				if len(lostLines) < 5*n {
					t.Fatalf("lost reply = %q; want %d claims", lost, n)
				}
				for i, c := range cs {
					if c.Outcome != Claimed {
						t.Errorf("ClaimBatch item %d after a lost reply = %v; want claimed", i, c.Outcome)
						continue
					}
					if tok := strconv.FormatInt(c.Lease.Token, 10); tok != lostLines[5*i+4] {
						t.Errorf("ClaimBatch item %d after a lost reply: token %s; want %s, the lost reply's", i, tok, lostLines[5*i+4])
					}
				}
				d.arm(confirmBatchScript.Hash(), 1+n)
				leases := make([]*Lease, n)
				for i, c := range cs {
					leases[i] = c.Lease
				}
				if err := s.ConfirmBatch(ctx, leases, nil); err != nil {
					t.Fatalf("ConfirmBatch after a lost reply: %v", err)
				}
				if writes, lost, _ := d.result(); writes != 2 || lost != fmt.Sprintf("*%d\r\n", n)+strings.Repeat(":1\r\n", n) {
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
				d.arm(confirmScript.Hash(), 1)
				if err := s.Confirm(ctx, cl.Lease, []byte("result")); err != nil {
					t.Fatalf("Confirm(%q) after a lost reply: %v; want nil", key, err)
				}
				writes, lost, armed := d.result()
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
	// Another test may load the script again in between: at most 2.
	if n, sent := h.take(); n > 2 {
		t.Errorf("ClaimBatch after SCRIPT FLUSH cost %d round trips (%v); want at most 2", n, sent)
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

// --- 4. Bad input before any I/O --------------------------------------------

func TestRedisBadInputBeforeIO(t *testing.T) {
	t.Parallel()
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	d := &lossyDialer{}
	c := redis.NewClient(&redis.Options{Addr: addr, Dialer: d.dial, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	h := &tripCounter{}
	c.AddHook(h)
	// AllowEviction: the constructor's only I/O is the eviction check.
	s, err := NewRedisStore(c, RedisOptions{AllowEviction: true, Options: Options{MaxKeyBytes: 16, MaxResultBytes: 8}})
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	ctx := context.Background()
	lease := &Lease{Key: "k", Token: 1, Owner: "w", TTL: time.Second}
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
		{"Confirm(empty key)", func() error { return s.Confirm(ctx, &Lease{Token: 1}, nil) }, ErrInvalidKey},
		{"Confirm(nil)", func() error { return s.Confirm(ctx, nil, nil) }, nil},
		{"Renew(nil)", func() error { return s.Renew(ctx, nil) }, nil},
		{"Forget(nil)", func() error { return s.Forget(ctx, nil) }, nil},
		{"Renew(long key)", func() error { return s.Renew(ctx, &Lease{Key: long}) }, ErrInvalidKey},
		{"Forget(empty key)", func() error { return s.Forget(ctx, &Lease{}) }, ErrInvalidKey},
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
	if d.dials != 0 {
		t.Errorf("bad input dialed Redis %d times; want never", d.dials)
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
	for _, backend := range []struct {
		name   string
		client func(t *testing.T) *redis.Client
	}{
		{"miniredis", func(t *testing.T) *redis.Client { _, c := newMiniredisClient(t); return c }},
		{"redis", func(t *testing.T) *redis.Client { return testenv.Redis(t) }},
	} {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			c := backend.client(t)
			var logs bytes.Buffer
			s := newTestRedisStore(t, c, RedisOptions{Options: Options{
				Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			}})
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
	lease := &Lease{Key: key, Token: 12, Owner: s.o.Worker, TTL: time.Second}
	for _, tt := range []struct {
		name string
		op   func() error
	}{
		{"Claim", func() error { _, err := s.Claim(ctx, key, nil); return err }},
		{"Renew", func() error { return s.Renew(ctx, lease) }},
		{"Confirm", func() error { return s.Confirm(ctx, lease, []byte("r")) }},
		{"Forget", func() error { return s.Forget(ctx, lease) }},
		{"Lookup", func() error { _, err := s.Lookup(ctx, key); return err }},
		{"ClaimBatch", func() error { _, err := s.ClaimBatch(ctx, []string{key}, nil); return err }},
		{"ConfirmBatch", func() error { return s.ConfirmBatch(ctx, []*Lease{lease}, nil) }},
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
}

// --- 6. Eviction policy -----------------------------------------------------

// TestRedisEvictionPolicy changes the shared Redis's maxmemory-policy for a
// moment: not parallel, and restored at once.
func TestRedisEvictionPolicy(t *testing.T) {
	c := testenv.Redis(t)
	ctx := context.Background()
	was, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		t.Fatalf("CONFIG GET maxmemory-policy: %v", err)
	}
	if was["maxmemory-policy"] != "noeviction" {
		t.Fatalf("maxmemory-policy is %q; want the test Redis at noeviction", was["maxmemory-policy"])
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory-policy allkeys-lru: %v", err)
	}
	t.Cleanup(func() {
		if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
			t.Errorf("restoring maxmemory-policy noeviction: %v", err)
		}
	})
	_, err = NewRedisStore(c, RedisOptions{Prefix: redisTestPrefix(t)})
	if err == nil || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Errorf("NewRedisStore on allkeys-lru = %v; want an error naming the policy", err)
	}
	if _, err := NewRedisStore(c, RedisOptions{Prefix: redisTestPrefix(t), AllowEviction: true}); err != nil {
		t.Errorf("NewRedisStore on allkeys-lru with AllowEviction = %v; want nil", err)
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatalf("restoring maxmemory-policy noeviction: %v", err)
	}
	if _, err := NewRedisStore(c, RedisOptions{Prefix: redisTestPrefix(t)}); err != nil {
		t.Errorf("NewRedisStore on noeviction = %v; want nil", err)
	}
}

// TestRedisEvictionPolicyCluster: one master that may evict is enough to
// refuse the cluster.
func TestRedisEvictionPolicyCluster(t *testing.T) {
	c := testenv.Cluster(t)
	ctx := context.Background()
	var one *redis.Client
	var mu sync.Mutex
	_ = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		if one == nil || m.Options().Addr > one.Options().Addr {
			one = m
		}
		return nil
	})
	if err := one.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl").Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory-policy volatile-ttl on %s: %v", one.Options().Addr, err)
	}
	t.Cleanup(func() {
		if err := one.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
			t.Errorf("restoring maxmemory-policy noeviction on %s: %v", one.Options().Addr, err)
		}
	})
	_, err := NewRedisStore(c, RedisOptions{Prefix: redisTestPrefix(t)})
	if err == nil || !strings.Contains(err.Error(), "volatile-ttl") {
		t.Errorf("NewRedisStore on a cluster with one volatile-ttl master = %v; want an error naming the policy", err)
	}
}

// TestRedisEvictionPolicyUnreadable: miniredis has no CONFIG command, like
// managed services that refuse it: the store is made, with a warning.
func TestRedisEvictionPolicyUnreadable(t *testing.T) {
	t.Parallel()
	_, c := newMiniredisClient(t)
	if err := c.ConfigGet(context.Background(), "maxmemory-policy").Err(); err == nil {
		t.Fatalf("miniredis answered CONFIG GET; this test needs a server that refuses it")
	}
	if _, err := NewRedisStore(c, RedisOptions{}); err != nil {
		t.Errorf("NewRedisStore on a server refusing CONFIG, no Logger = %v; want nil", err)
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	if _, err := NewRedisStore(c, RedisOptions{Options: Options{Logger: logger}}); err != nil {
		t.Errorf("NewRedisStore on a server refusing CONFIG = %v; want nil", err)
	}
	if got := logs.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "maxmemory-policy") {
		t.Errorf("log = %q; want a warning about maxmemory-policy", got)
	}
}

// --- 7. Options -------------------------------------------------------------

func TestRedisOptionsRefused(t *testing.T) {
	t.Parallel()
	_, c := newMiniredisClient(t)
	var nilClient *redis.Client
	for _, tt := range []struct {
		name string
		c    redis.UniversalClient
		o    RedisOptions
	}{
		{"nil client", nil, RedisOptions{}},
		{"typed nil client", nilClient, RedisOptions{}},
		{"typed nil client, AllowEviction", nilClient, RedisOptions{AllowEviction: true}},
		{"prefix with {", c, RedisOptions{Prefix: "a{"}},
		{"prefix with }", c, RedisOptions{Prefix: "}a:"}},
		{"prefix with a hash tag", c, RedisOptions{Prefix: "{tenant}:"}},
		{"negative Retention", c, RedisOptions{Options: Options{Retention: -time.Second}}},
		{"negative LeaseTTL", c, RedisOptions{Options: Options{LeaseTTL: -1}}},
		{"sub-millisecond LeaseTTL", c, RedisOptions{Options: Options{LeaseTTL: time.Microsecond}}},
		{"negative MaxKeyBytes", c, RedisOptions{Options: Options{MaxKeyBytes: -1}}},
		{"negative MaxResultBytes", c, RedisOptions{Options: Options{MaxResultBytes: -1}}},
		{"Worker with NUL", c, RedisOptions{Options: Options{Worker: "a\x00b"}}},
	} {
		s, err := func() (s *RedisStore, err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			return NewRedisStore(tt.c, tt.o)
		}()
		if err == nil || strings.HasPrefix(err.Error(), "panic") {
			t.Errorf("NewRedisStore(%s) = %v, %v; want an error", tt.name, s, err)
		}
	}
	s, err := NewRedisStore(c, RedisOptions{})
	if err != nil {
		t.Fatalf("NewRedisStore(zero options) = %v; want nil", err)
	}
	if got := s.redisKey("k"); got != "idem:{k}" {
		t.Errorf("redisKey(%q) with the default prefix = %q; want %q", "k", got, "idem:{k}")
	}
}

// --- 8. UniversalClient -----------------------------------------------------

func TestRedisUniversalClient(t *testing.T) {
	for _, backend := range []struct {
		name  string
		addrs func(t *testing.T) []string
	}{
		{"redis", func(t *testing.T) []string { return []string{testenv.Lookup(t, testenv.RedisAddrVar)} }},
		{"cluster", func(t *testing.T) []string {
			return strings.Split(testenv.Lookup(t, testenv.ClusterAddrsVar), ",")
		}},
	} {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: backend.addrs(t)})
			t.Cleanup(func() { _ = c.Close() })
			s := newTestRedisStore(t, c, RedisOptions{})
			ctx := context.Background()
			key := uuid.NewString()
			cl, err := s.Claim(ctx, key, []byte("fp"))
			if err != nil || cl.Outcome != Claimed {
				t.Fatalf("Claim(%q) = %v, %v; want claimed", key, cl.Outcome, err)
			}
			if again, err := s.Claim(ctx, key, []byte("fp")); err != nil || again.Outcome != InProgress {
				t.Fatalf("second Claim(%q) = %v, %v; want in-progress", key, again.Outcome, err)
			}
			if err := s.Confirm(ctx, cl.Lease, []byte("done")); err != nil {
				t.Fatalf("Confirm(%q): %v", key, err)
			}
			d, err := s.Claim(ctx, key, []byte("fp"))
			if err != nil || d.Outcome != Duplicate || string(d.Record.Result) != "done" {
				t.Fatalf("Claim(%q) after Confirm = %+v, %v; want duplicate with result %q", key, d, err, "done")
			}
			keys := uuidKeys(30)
			if err := s.ConfirmBatch(ctx, claimAllOK(t, s, keys, nil), nil); err != nil {
				t.Fatalf("ConfirmBatch: %v", err)
			}
			checkAllDuplicate(t, s, keys)
		})
	}
}

// --- 9. Memory per record ---------------------------------------------------

// TestRedisMemoryPerRecord measures what a confirmed record costs Redis:
// used_memory before and after writing 100,000 of them. Other tests writing
// to the same Redis at the same time blur the figure.
func TestRedisMemoryPerRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 200,000 records; skipped with -short")
	}
	c := testenv.Redis(t)
	ctx := context.Background()
	const n, batch = 100_000, 500
	measure := func(fp []byte) (perRecord, usage float64, keyLen int) {
		t.Helper()
		// A 6-byte prefix puts the key name (44 bytes) in the same
		// allocator size class as the default "idem:" does (43 bytes): what
		// a deployment pays. The keys are random UUIDs, so a prefix shared
		// with another run could not mix records up.
		var b [2]byte
		_, _ = rand.Read(b[:])
		prefix := "i" + hex.EncodeToString(b[:]) + ":"
		s := newTestRedisStore(t, c, RedisOptions{Prefix: prefix, Options: Options{Retention: 10 * time.Minute}})
		keys := uuidKeys(n)
		var fps [][]byte
		if fp != nil {
			fps = make([][]byte, batch)
			for i := range fps {
				fps[i] = fp
			}
		}
		before := usedMemory(t, c)
		for i := 0; i < n; i += batch {
			if err := s.ConfirmBatch(ctx, claimAllOK(t, s, keys[i:i+batch], fps), nil); err != nil {
				t.Fatalf("ConfirmBatch: %v", err)
			}
		}
		after := usedMemory(t, c)
		var sum int64
		const sample = 200
		for _, k := range keys[:sample] {
			u, err := c.MemoryUsage(ctx, s.redisKey(k)).Result()
			if err != nil {
				t.Fatalf("MEMORY USAGE: %v", err)
			}
			sum += u
		}
		// Free the memory now rather than at cleanup: the next measure
		// starts from the same place.
		for i := 0; i < n; i += 1000 {
			rks := make([]string, 0, 1000)
			for _, k := range keys[i : i+1000] {
				rks = append(rks, s.redisKey(k))
			}
			if err := c.Unlink(ctx, rks...).Err(); err != nil {
				t.Fatalf("UNLINK: %v", err)
			}
		}
		return float64(after-before) / n, float64(sum) / sample, len(s.redisKey(keys[0]))
	}

	per, usage, keyLen := measure(nil)
	t.Logf("confirmed record, %d-byte Redis key, no fingerprint, empty result: %.1f bytes (used_memory), MEMORY USAGE %.0f",
		keyLen, per, usage)
	if per > 200 {
		t.Errorf("a confirmed record costs %.1f bytes of Redis memory; want at most 200", per)
	}
	per, usage, keyLen = measure(bytes.Repeat([]byte{0xAB}, 32))
	t.Logf("confirmed record, %d-byte Redis key, 32-byte fingerprint, empty result: %.1f bytes (used_memory), MEMORY USAGE %.0f",
		keyLen, per, usage)
}

func usedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatalf("INFO memory: %v", err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO memory: used_memory %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("INFO memory has no used_memory: %q", info)
	return 0
}
