package kafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/consumer/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fleetConfirmBudget is how long the wrapper retries a Confirm: half the
// 300 ms lease. A crashed process's confirms fail at once and give up at
// the end of it; a live one's must not time out on a loaded machine (at
// 20 ms, a CI run had confirms cut off, work done and not recorded, and
// so double effects no crash explained).
const fleetConfirmBudget = 150 * time.Millisecond

// A fleet of 3 consumers of one group over 4 partitions, where every
// message is produced at least twice, to random partitions (so that its
// copies race on different consumers), while consumers are closed
// mid-handler (a rebalance: the handler sees its context end, its claim is
// forgotten, the partition moves) and crash mid-handler (the store stops
// answering: the lease is abandoned, the broker refuses its commits, and
// the consumer is closed). A closed
// or crashed consumer is replaced by a new one. The ledger must show every
// message's effect once, plus one extra effect per confirmation that a
// crash prevented after the handler had applied the effect, no more, no
// less; every key must be confirmed in the store once the group has
// committed every partition to its end (0 lost).
func TestFleetKafka(t *testing.T) {
	const (
		messages   = 200
		consumers  = 3
		partitions = 4
		ttl        = 500 * time.Millisecond // idem.MinLeaseTTL
	)
	rc := testRedis(t)
	kc := newCluster(t, partitions)
	pfx := prefix(t)
	var rs []*kgo.Record
	for i := range messages {
		id := fmt.Sprintf("msg-%03d", i)
		n := 2
		if rand.Float64() < 0.3 {
			n = 3
		}
		for range n {
			rs = append(rs, &kgo.Record{Topic: topic, Partition: rand.Int32N(partitions), Value: []byte(id),
				Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(id)}}})
		}
	}
	rand.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
	ends := produceAll(t, kc, rs)
	// A crashed consumer commits nothing more: the broker refuses (closes
	// the connection of) its members' offset commits.
	var deadMembers sync.Map
	kc.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if _, dead := deadMembers.Load(req.(*kmsg.OffsetCommitRequest).MemberID); dead {
			kc.KeepControl()
			return nil, errCrashed, true
		}
		return nil, nil, false
	})

	var mu sync.Mutex
	effects := map[string]int{}
	faults := map[string]int{} // closes and crashes per message, at most 2
	var closes, crashBefore, crashAfterRolls int
	var unconfirmed sync.Map // crashLease -> struct{}
	ctx, cancelAll := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelAll()

	run := func(name string) {
		store := &crashBatchStore{crashStore: crashStore{Store: newStore(t, rc, pfx, name, ttl), Unconfirmed: &unconfirmed}}
		var c *kafka.Consumer
		var closing sync.Once
		closeAsync := func() { closing.Do(func() { go c.Close() }) }
		crash := func() {
			member, _ := c.Client().GroupMetadata()
			deadMembers.Store(member, true)
			store.Dead.Store(true)
		}
		h := func(hctx context.Context, r *kgo.Record) error {
			if err := hctx.Err(); err != nil {
				return err
			}
			id := string(r.Value)
			mu.Lock()
			roll := rand.Float64()
			few := faults[id] < 2
			switch {
			case few && roll < 0.03:
				faults[id]++
				closes++
				mu.Unlock()
				closeAsync() // a rebalance while the handler runs
				<-hctx.Done()
				return hctx.Err()
			case few && roll < 0.06:
				faults[id]++
				crashBefore++
				mu.Unlock()
				crash()
				closeAsync()
				return errCrashed
			}
			effects[id]++
			if few && roll < 0.09 {
				faults[id]++
				crashAfterRolls++
				crash() // the effect is applied; the confirm will not be
				closeAsync()
			}
			mu.Unlock()
			return nil
		}
		var err error
		c, err = kafka.NewConsumer(store, h, kafka.Options{Group: "g", Topics: []string{topic}, Client: clientOpts(kc),
			MaxPollRecords: 32, MinDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond,
			CommitInterval: 100 * time.Millisecond, ConfirmBudget: fleetConfirmBudget, Logger: quiet})
		if err != nil {
			t.Error(err)
			return
		}
		_ = c.Run(ctx)
		closeAsync()
	}
	var wg sync.WaitGroup
	var restarts atomic.Int64
	for w := range consumers {
		wg.Go(func() {
			for gen := 0; ctx.Err() == nil; gen++ {
				run(fmt.Sprintf("c%d.%d", w, gen))
				restarts.Add(1)
			}
		})
	}
	for {
		got := committed(t, kc, "g")
		drained := true
		for p, end := range ends {
			if got[p] != end {
				drained = false
			}
		}
		if drained {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the group did not commit every partition to its end in 60s: committed %v, ends %v", got, ends)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancelAll()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	prevented := map[string]int{}
	unconfirmed.Range(func(k, _ any) bool {
		prevented[k.(crashLease).Key]++
		return true
	})
	inspect := newStore(t, rc, pfx, "inspector", ttl)
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
			t.Errorf("%s: Lookup = %+v, %v; want confirmed (committed past without its work confirmed: lost)", id, rec, err)
		}
	}
	if doubles != after {
		t.Errorf("double effects %d != confirmations prevented by a crash after the effect %d", doubles, after)
	}
	if closes == 0 || crashBefore == 0 || after == 0 {
		t.Errorf("closes %d, crashes before the effect %d, confirmations prevented %d: want every fault exercised",
			closes, crashBefore, after)
	}
	t.Logf("%d messages in %d records over %d partitions (every one at least twice), %d consumers; "+
		"%d closed mid-handler (rebalances), %d crashed before the effect, %d after it; %d confirmations "+
		"prevented by those crashes (the crashed consumer's own record and its batch's other successes) = "+
		"%d double effects; %d consumer restarts",
		messages, len(rs), partitions, consumers, closes, crashBefore, crashAfterRolls, after, doubles, restarts.Load())
}

// produceAll produces rs (to their own partitions) and returns each
// partition's end offset.
func produceAll(t testing.TB, kc interface{ ListenAddrs() []string }, rs []*kgo.Record) map[int32]int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := cl.ProduceSync(ctx, rs...)
	if err := res.FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	ends := map[int32]int64{}
	for _, r := range res {
		ends[r.Record.Partition] = max(ends[r.Record.Partition], r.Record.Offset+1)
	}
	return ends
}
