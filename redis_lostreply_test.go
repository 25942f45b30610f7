package idem

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
)

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
				// A new lease is answered with its token alone: $16, token.
				d.arm(claimScript.Hash(), 2)
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
				if again.Record.Token != cl.Lease.Token || again.Record.Owner != s.o.Worker {
					t.Errorf("second Claim(%q): holder token %d owner %q; want %d %q",
						key, again.Record.Token, again.Record.Owner, cl.Lease.Token, s.o.Worker)
				}
			})

			t.Run("batch", func(t *testing.T) {
				const n = 10
				keys := uuidKeys(n)
				// On one Redis the batch is one claim_batch.lua call:
				// an array header, then each new lease's bare token in 2
				// lines.
				d.arm(claimBatchScript.Hash(), 1+2*n)
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
