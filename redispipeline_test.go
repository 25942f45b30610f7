package idem

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testing/testenv"
)

// askTally is a go-redis hook on a ClusterClient, above its redirect
// handling: it counts the commands go-redis handed back answered ASK, in a
// pipeline (which the store must send again) and alone.
type askTally struct{ pipelined, single atomic.Int64 }

func isAsk(err error) bool { return err != nil && redis.HasErrorPrefix(err, "ASK") }

func (h *askTally) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *askTally) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if isAsk(cmd.Err()) {
			h.single.Add(1)
		}
		return err
	}
}

func (h *askTally) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if isAsk(c.Err()) {
				h.pipelined.Add(1)
			}
		}
		return err
	}
}

// keyInSlot returns the first key base+"0", base+"1", ... whose record is in
// slot. base must need no escaping (letters, digits, ':'): the store key is
// then its record's hash tag, and its slot that of its CRC16.
func keyInSlot(base string, slot int) string {
	for n := 0; ; n++ {
		if k := base + strconv.Itoa(n); int(crc16(k)%16384) == slot {
			return k
		}
	}
}

// askCase is what one part of TestRedisClusterPipelineASK does while its
// slot is open: confirmed and claimed are its records made before the
// moves (the leases of the claimed ones), fresh its keys never used; s
// is the store on the lagging client, g the gate on that client.
type askCase struct {
	name               string
	auto               bool // RedisOptions.AutoPipeline
	confirmed, claimed int  // records made before the moves
	fresh              int  // keys never used
	// run makes the part's calls, and returns the claims (by key) and the
	// confirmations they made, to be looked up after the move.
	run func(t *testing.T, s *RedisStore, g *gate, k askKeys) (claims map[string]*Lease, confirms []*Lease)
}

// askKeys are one part's keys, all in its slot.
type askKeys struct {
	confirmed []string
	leases    []*Lease // of the claimed records
	fresh     []string
	other     []string // in another slot of the same master, which does not move
}

// TestRedisClusterPipelineASK pins that a pipeline's ASK never reaches a
// caller: ClaimBatch, ConfirmBatch and AutoPipeline calls on keys of a slot
// in the middle of a move (MIGRATING on one master, IMPORTING on another,
// half its keys moved) are all answered. Each part makes it happen on
// purpose, on a cluster of the test's own, rather than waiting for a
// resharding's timing to bring it about: the store's client loaded its
// slot map while the slot was on master C; the slot then moved to A, and
// is now moving from A to B; the client may follow one redirect
// (MaxRedirects 1: with go-redis's default of 3 the pipeline would follow
// this chain itself, and a longer one needs a map that lags by more than
// a test can arrange). A command of a pipeline goes to C, which answers
// MOVED A; A answers ASK B for a key it no longer holds (or never held),
// and go-redis, its redirects spent, hands the ASK back: the store must
// send the command again (resendRedirected), or the caller gets "ASK ...".
// The MOVED has made go-redis reload its map, so the command sent again
// goes to A and follows the ASK.
func TestRedisClusterPipelineASK(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t, 3, 0)
	ctx := context.Background()
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = admin.Close() })
	prefix := testenv.UniquePrefix()
	opts := RedisOptions{Prefix: prefix, LeaseTTL: time.Minute}
	adminStore, err := NewRedisStore(admin, opts)
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	// The first slot of each master's range: part i moves that of master i.
	shards, err := admin.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SHARDS: %v", err)
	}
	first := map[string]int{}
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			addr := net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
			for _, r := range sh.Slots {
				if f, ok := first[addr]; n.Role == "master" && (!ok || int(r.Start) < f) {
					first[addr] = int(r.Start)
				}
			}
		}
	}

	cases := []askCase{
		{name: "ClaimBatch", confirmed: 8, claimed: 8, fresh: 16,
			run: func(t *testing.T, s *RedisStore, _ *gate, k askKeys) (map[string]*Lease, []*Lease) {
				keys := append(append(append([]string{}, k.confirmed...), leaseKeys(k.leases)...), k.fresh...)
				cs, err := s.ClaimBatch(ctx, keys, nil)
				if err != nil {
					t.Fatalf("ClaimBatch of %d keys of the open slot: %v; want every item answered", len(keys), err)
				}
				claims := map[string]*Lease{}
				for i, c := range cs {
					want := Claimed
					switch {
					case i < len(k.confirmed):
						want = Duplicate
					case i < len(k.confirmed)+len(k.leases):
						want = InProgress
					default:
						claims[keys[i]] = c.Lease
					}
					if c.Outcome != want {
						t.Errorf("ClaimBatch item %q = %v; want %v", keys[i], c.Outcome, want)
					}
				}
				return claims, nil
			}},
		// Only claims before the moves, so that some of the leases confirmed
		// are on the keys already moved.
		{name: "ConfirmBatch", claimed: 16,
			run: func(t *testing.T, s *RedisStore, _ *gate, k askKeys) (map[string]*Lease, []*Lease) {
				if err := s.ConfirmBatch(ctx, k.leases, resultsOf(k.leases)); err != nil {
					t.Fatalf("ConfirmBatch of %d leases of the open slot: %v; want every item answered", len(k.leases), err)
				}
				return nil, k.leases
			}},
		// Only claims before the moves, as for ConfirmBatch: some of the
		// Confirms are on keys already moved, and the Claims of fresh keys
		// meet ASK wherever they are.
		{name: "AutoPipeline", auto: true, claimed: 16, fresh: 16,
			run: func(t *testing.T, s *RedisStore, g *gate, k askKeys) (map[string]*Lease, []*Lease) {
				// Both senders held on keys of a slot that does not move,
				// so that the calls on the open slot queue and go in one
				// pipeline, not alone.
				g.close()
				var held sync.WaitGroup
				for _, key := range k.other {
					held.Go(func() {
						if _, err := s.Claim(ctx, key, nil); err != nil {
							t.Errorf("Claim(%q) holding a sender: %v", key, err)
						}
					})
				}
				g.waitEntered(t, len(k.other))
				var mu sync.Mutex
				claims := map[string]*Lease{}
				var wg sync.WaitGroup
				for _, key := range k.fresh {
					wg.Go(func() {
						c, err := s.Claim(ctx, key, nil)
						if err != nil || c.Outcome != Claimed {
							t.Errorf("Claim(%q) in a pipeline on the open slot = %v, %v; want %v", key, c.Outcome, err, Claimed)
							return
						}
						mu.Lock()
						claims[key] = c.Lease
						mu.Unlock()
					})
				}
				for _, l := range k.leases {
					wg.Go(func() {
						if err := s.Confirm(ctx, l, resultsOf([]*Lease{l})[0]); err != nil {
							t.Errorf("Confirm(%q) in a pipeline on the open slot = %v; want nil", l.Key, err)
						}
					})
				}
				waitQueued(t, s, len(k.fresh)+len(k.leases))
				g.release()
				wg.Wait()
				held.Wait()
				return claims, k.leases
			}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// C (from) → A (via), then A → B (to), held open while the
			// part runs.
			from, via, to := cl.Nodes[i], cl.Nodes[(i+1)%3], cl.Nodes[(i+2)%3]
			slot, ok := first[from.Addr]
			if !ok {
				t.Fatalf("CLUSTER SHARDS names no slot of master %s (first slots %v)", from.Addr, first)
			}
			base := fmt.Sprintf("ask:%d:", i)
			var k askKeys
			for j := range tc.confirmed {
				k.confirmed = append(k.confirmed, keyInSlot(base+"confirmed:"+strconv.Itoa(j)+":", slot))
			}
			var claimed []string
			for j := range tc.claimed {
				claimed = append(claimed, keyInSlot(base+"claimed:"+strconv.Itoa(j)+":", slot))
			}
			for j := range tc.fresh {
				k.fresh = append(k.fresh, keyInSlot(base+"fresh:"+strconv.Itoa(j)+":", slot))
			}
			for j := range autoPipeSenders {
				k.other = append(k.other, keyInSlot(base+"other:"+strconv.Itoa(j)+":", slot+1))
			}
			for _, key := range append(append(append([]string{}, k.confirmed...), claimed...), k.fresh...) {
				if got := keySlot(adminStore.redisKey(key)); got != slot {
					t.Fatalf("key %q: record %q in slot %d; want %d", key, adminStore.redisKey(key), got, slot)
				}
			}
			if got, err := admin.ClusterKeySlot(ctx, adminStore.redisKey(claimed[0])).Result(); err != nil || int(got) != slot {
				t.Fatalf("CLUSTER KEYSLOT %q = %d, %v; want %d", adminStore.redisKey(claimed[0]), got, err, slot)
			}

			// The records made before the moves, on C.
			leases := claimAllOK(t, adminStore, append(append([]string{}, k.confirmed...), claimed...), nil)
			if len(k.confirmed) > 0 {
				if err := adminStore.ConfirmBatch(ctx, leases[:len(k.confirmed)], nil); err != nil {
					t.Fatalf("ConfirmBatch before the moves: %v", err)
				}
			}
			k.leases = leases[len(k.confirmed):]

			// The store's client loads its slot map now, with the slot on C.
			tally := &askTally{}
			g := newGate()
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRedirects: 1})
			t.Cleanup(func() { _ = c.Close() })
			c.AddHook(tally)
			c.AddHook(g)
			o := opts
			o.NoAutoPipeline = !tc.auto
			s, err := NewRedisStore(c, o)
			if err != nil {
				t.Fatalf("NewRedisStore: %v", err)
			}
			// First contact now, before the gate holds pipelines and the
			// slot moves: what follows is the steady state.
			if err := s.Check(ctx); err != nil {
				t.Fatalf("Check: %v", err)
			}
			owner := func() string {
				m, err := c.MasterForKey(ctx, s.redisKey(claimed[0]))
				if err != nil {
					t.Fatalf("MasterForKey: %v", err)
				}
				return m.Options().Addr
			}
			if got := owner(); got != from.Addr {
				t.Fatalf("the client's map puts slot %d on %s; want %s", slot, got, from.Addr)
			}
			if err := cl.MoveSlot(ctx, slot, from, via, nil); err != nil {
				t.Fatalf("moving slot %d %s → %s: %v", slot, from.Addr, via.Addr, err)
			}
			if got := owner(); got != from.Addr {
				t.Fatalf("after the move the client's map puts slot %d on %s; want %s still (a map that lags)", slot, got, from.Addr)
			}

			var claims map[string]*Lease
			var confirms []*Lease
			err = cl.MoveSlot(ctx, slot, via, to, func(moved, left int64) error {
				if moved == 0 || left == 0 {
					return fmt.Errorf("%d keys moved, %d left; want some of each", moved, left)
				}
				claims, confirms = tc.run(t, s, g, k)
				return nil
			})
			if err != nil {
				t.Fatalf("moving slot %d %s → %s: %v", slot, via.Addr, to.Addr, err)
			}
			if tally.pipelined.Load() == 0 {
				t.Errorf("go-redis handed back no pipelined command answered ASK (%d alone); want some: "+
					"the part did not put the store's resending of ASK to the test", tally.single.Load())
			}
			t.Logf("go-redis handed back %d pipelined and %d single commands answered ASK",
				tally.pipelined.Load(), tally.single.Load())

			// What the calls did is where it should be, on B.
			for key, l := range claims {
				rec, err := adminStore.Lookup(ctx, key)
				if err != nil || rec.Confirmed || rec.Token != l.Token {
					t.Errorf("Lookup(%q) after the move = %+v, %v; want the claim of token %d", key, rec, err, l.Token)
				}
			}
			for _, l := range confirms {
				rec, err := adminStore.Lookup(ctx, l.Key)
				if want := resultsOf([]*Lease{l})[0]; err != nil || !rec.Confirmed || string(rec.Result) != string(want) {
					t.Errorf("Lookup(%q) after the move = %+v, %v; want confirmed with %q", l.Key, rec, err, want)
				}
			}
		})
	}
}

func leaseKeys(ls []*Lease) []string {
	keys := make([]string, len(ls))
	for i, l := range ls {
		keys[i] = l.Key
	}
	return keys
}

// resultsOf returns the result each lease is confirmed with.
func resultsOf(ls []*Lease) [][]byte {
	rs := make([][]byte, len(ls))
	for i, l := range ls {
		rs[i] = []byte("done:" + l.Key)
	}
	return rs
}
