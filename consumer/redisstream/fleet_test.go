package redisstream_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/internal/testing/crashstore"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/redis/go-redis/v9"
)

// fleetConfirmBudget is how long the wrapper retries a Confirm: half the
// 300 ms lease. A crashed process's confirms fail at once and give up at
// the end of it; a live one's must not time out on a loaded machine (at
// 20 ms, a CI run had confirms cut off, work done and not recorded, and
// so double effects no crash explained).
const fleetConfirmBudget = 150 * time.Millisecond

// A fleet of 4 readers of one group, over a stream where every message is
// added at least twice (a producer's duplicates), while readers are stopped
// mid-handler (their context cancelled: the store still answers, the claim
// is forgotten) and crash mid-handler (store and stream stop answering: the
// lease is abandoned, nothing is acked). A stopped or crashed reader is
// replaced by a new one, under a new consumer name; the old one's pending
// entries are reclaimed with XAUTOCLAIM. The ledger must show every
// message's effect once, plus one extra effect per confirmation that a crash
// prevented after the handler had applied the effect, no more, no less; and
// nothing may be acked without its work confirmed or found done (0 lost).
func TestFleetRedisStream(t *testing.T) {
	const (
		messages = 300
		readers  = 4
		ttl      = idem.MinLeaseTTL
	)
	c := testenv.Redis(t)
	stream := unique(t, "fleet")
	pfx := prefix(t)
	ids := make([]string, 0, messages*3)
	for i := range messages {
		id := fmt.Sprintf("msg-%03d", i)
		ids = append(ids, id, id) // every message delivered at least twice
		if rand.Float64() < 0.3 {
			ids = append(ids, id)
		}
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	add(t, c, stream, ids...)

	var mu sync.Mutex
	effects := map[string]int{}
	faults := map[string]int{} // stops and crashes per message, at most 2
	var stops, crashBefore, crashAfterRolls int
	var unconfirmed sync.Map // crashstore.Lease -> struct{}: a success whose Confirm met a dead store
	var roll = func() float64 { return rand.Float64() }

	ctx, cancelAll := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelAll()
	// reader runs one reader process until it is stopped or crashes, or
	// the fleet is done.
	reader := func(name string) {
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		store := &crashstore.BatchStore{Store: crashstore.Store{Store: fleetStore(t, c, pfx, name, ttl), Unconfirmed: &unconfirmed}}
		client := &crashClient{Client: c, dead: &store.Dead}
		h := func(hctx context.Context, m redis.XMessage) error {
			if err := hctx.Err(); err != nil {
				return err // a handler that sees its context end does no more
			}
			id := m.Values["id"].(string)
			mu.Lock()
			defer mu.Unlock()
			r := roll()
			few := faults[id] < 2
			switch {
			case few && r < 0.03:
				faults[id]++
				stops++
				stop() // stopped mid-handler: it returns the context's error
				return hctx.Err()
			case few && r < 0.06:
				faults[id]++
				crashBefore++
				store.Dead.Store(true)
				stop()
				return crashstore.ErrCrashed
			}
			effects[id]++
			if few && r < 0.09 {
				faults[id]++
				crashAfterRolls++
				store.Dead.Store(true) // the effect is applied; the confirm will not be
				stop()
			}
			return nil
		}
		r, err := redisstream.NewReader(client, store, h, redisstream.Options{Stream: stream, Group: "g",
			Consumer: name, KeyField: "id", Count: 16, Block: 50 * time.Millisecond, MinIdle: ttl,
			ConfirmBudget: fleetConfirmBudget, Logger: quiet})
		if err != nil {
			t.Error(err)
			return
		}
		_ = r.Run(rctx)
	}
	var wg sync.WaitGroup
	var restarts atomic.Int64
	for w := range readers {
		wg.Go(func() {
			for gen := 0; ctx.Err() == nil; gen++ {
				reader(fmt.Sprintf("r%d.%d", w, gen))
				restarts.Add(1)
			}
		})
	}
	// Done when the group has read every entry and none is pending.
	for {
		gs, err := c.XInfoGroups(context.Background(), stream).Result()
		if err == nil && len(gs) == 1 && gs[0].Lag == 0 && gs[0].Pending == 0 && gs[0].EntriesRead >= int64(len(ids)) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the group did not drain in 30s: %+v, %v", gs, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancelAll()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	prevented := map[string]int{}
	unconfirmed.Range(func(k, _ any) bool {
		prevented[k.(crashstore.Lease).Key]++
		return true
	})
	inspect := newStore(t, c, pfx, "inspector", ttl)
	var doubles, after int
	for i := range messages {
		id := fmt.Sprintf("msg-%03d", i)
		doubles += effects[id] - 1
		after += prevented[id]
		if effects[id] != 1+prevented[id] {
			t.Errorf("%s: effect applied %d times, %d confirmations prevented by a crash after it; want 1 + %d",
				id, effects[id], prevented[id], prevented[id])
		}
		if rec, err := inspect.Lookup(context.Background(), id); err != nil || !rec.Confirmed {
			t.Errorf("%s: Lookup = %+v, %v; want confirmed (acked without its work confirmed: lost)", id, rec, err)
		}
	}
	if doubles != after {
		t.Errorf("double effects %d != confirmations prevented by a crash after the effect %d", doubles, after)
	}
	if stops == 0 || crashBefore == 0 || after == 0 {
		t.Errorf("stops %d, crashes before the effect %d, confirmations prevented %d: want every fault exercised",
			stops, crashBefore, after)
	}
	if n := pending(t, c, stream, "g"); n != 0 {
		t.Errorf("%d entries pending after the drain; want 0", n)
	}
	t.Logf("%d messages in %d entries (every one at least twice), %d readers; %d stopped mid-handler, "+
		"%d crashed before the effect, %d after it; %d confirmations prevented by those crashes "+
		"(the crashed reader's own message and its batch's other successes) = %d double effects; %d reader restarts",
		messages, len(ids), readers, stops, crashBefore, crashAfterRolls, after, doubles, restarts.Load())
}

// crashClient is the reader process's connection to the stream: dead with
// its store, so that a crashed reader acks nothing.
type crashClient struct {
	redisstream.Client
	dead *atomic.Bool
}

func (c *crashClient) XGroupCreateMkStream(ctx context.Context, stream, group, start string) *redis.StatusCmd {
	if c.dead.Load() {
		cmd := redis.NewStatusCmd(ctx)
		cmd.SetErr(crashstore.ErrCrashed)
		return cmd
	}
	return c.Client.XGroupCreateMkStream(ctx, stream, group, start)
}

func (c *crashClient) XReadGroup(ctx context.Context, a *redis.XReadGroupArgs) *redis.XStreamSliceCmd {
	if c.dead.Load() {
		cmd := redis.NewXStreamSliceCmd(ctx)
		cmd.SetErr(crashstore.ErrCrashed)
		return cmd
	}
	return c.Client.XReadGroup(ctx, a)
}

func (c *crashClient) XAutoClaim(ctx context.Context, a *redis.XAutoClaimArgs) *redis.XAutoClaimCmd {
	if c.dead.Load() {
		cmd := redis.NewXAutoClaimCmd(ctx)
		cmd.SetErr(crashstore.ErrCrashed)
		return cmd
	}
	return c.Client.XAutoClaim(ctx, a)
}

func (c *crashClient) XAck(ctx context.Context, stream, group string, ids ...string) *redis.IntCmd {
	if c.dead.Load() {
		cmd := redis.NewIntCmd(ctx)
		cmd.SetErr(crashstore.ErrCrashed)
		return cmd
	}
	return c.Client.XAck(ctx, stream, group, ids...)
}

// fleetStore is a process's store in the fleet: newStore's, with a limit of
// take-overs no message of the fleet reaches. A crash takes down every
// message of the process's batch, so a message can lapse more times in a
// row than the default MaxTakeOvers, and would be quarantined (and
// dead-lettered); this fleet counts double effects, and quarantine is
// tested on its own.
func fleetStore(t testing.TB, c redis.UniversalClient, prefix, worker string, ttl time.Duration) *idem.RedisStore {
	t.Helper()
	s, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix, Worker: worker, LeaseTTL: ttl, Retention: time.Minute,
		MaxTakeOvers: fleetMaxTakeOvers})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const fleetMaxTakeOvers = 1000
