package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/internal/testing/crashstore"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// fleetConfirmBudget is how long the wrapper retries a Confirm: half the
// 300 ms lease. A crashed process's confirms fail at once and give up at
// the end of it; a live one's must not time out on a loaded machine (at
// 20 ms, a CI run had confirms cut off, work done and not recorded, and
// so double effects no crash explained).
const fleetConfirmBudget = 150 * time.Millisecond

// A fleet of 8 workers over an in-process queue that duplicates messages,
// redelivers after lost acks, and "crashes" workers mid-handler: a crashed
// worker's store stops answering (its lease is abandoned, never forgotten)
// and the queue redelivers its message once the worker is gone, as a broker
// does on a dropped connection. The ledger must show every message's effect
// once, plus one extra effect per crash that fell after the effect and
// before the confirm — no more, no less.

const fleetTTL = idem.MinLeaseTTL

// fleetMaxTakeOvers lets a message be taken over again and again: the
// fleet crashes and stops workers on purpose, and on a busy machine a
// stalled renewal adds take-overs of its own. It checks once-ness; that a
// crash loop stops is storetest's to check (Quarantine/...).
const fleetMaxTakeOvers = 1000

func TestFleetMemory(t *testing.T) {
	shared := memStore(idem.Options{})
	runFleet(t, func(worker string) idem.Store {
		return must(shared.Share(idem.Options{Worker: worker, LeaseTTL: fleetTTL, MaxTakeOvers: fleetMaxTakeOvers}))
	}, shared)
}

func TestFleetRedis(t *testing.T) {
	c := testenv.Redis(t)
	prefix := fmt.Sprintf("idemtest:fleet:%d:", time.Now().UnixNano())
	mk := func(worker string) idem.Store {
		s, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix,
			Worker: worker, LeaseTTL: fleetTTL, Retention: time.Minute, MaxTakeOvers: fleetMaxTakeOvers})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	runFleet(t, mk, mk("inspector"))
}

// queue is an at-least-once broker in a channel: a delivery stays
// outstanding until acked.
type queue struct {
	ch          chan string
	outstanding atomic.Int64
	done        chan struct{}
	once        sync.Once
}

func newQueue(n int) *queue { return &queue{ch: make(chan string, n), done: make(chan struct{})} }

func (q *queue) publish(id string) { q.outstanding.Add(1); q.ch <- id }
func (q *queue) ack() {
	if q.outstanding.Add(-1) == 0 {
		q.once.Do(func() { close(q.done) })
	}
}
func (q *queue) redeliver(id string, after time.Duration) {
	time.AfterFunc(after, func() { q.ch <- id })
}

func runFleet(t *testing.T, newStore func(worker string) idem.Store, inspect idem.Store) {
	const (
		messages = 300
		workers  = 8
	)
	ctx := context.Background()
	ids := make([]string, messages)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s/msg-%03d", t.Name(), i)
	}

	var mu sync.Mutex
	effects := map[string]int{}     // the ledger
	crashBefore := map[string]int{} // crashes before the effect
	crashAfter := map[string]int{}  // crashes after the effect, before the confirm
	var confirms sync.Map           // id -> *atomic.Int64: successful Confirms

	q := newQueue(messages * 4)
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	var rmu sync.Mutex
	roll := func() float64 { rmu.Lock(); defer rmu.Unlock(); return rng.Float64() }

	for _, id := range ids {
		q.publish(id)
		if roll() < 0.3 { // a duplicate from the producer
			q.publish(id)
		}
	}

	// worker runs one worker process until it crashes or the queue drains;
	// it reports whether it crashed.
	worker := func(name string) bool {
		store := &crashstore.Store{Store: countConfirms{newStore(name), &confirms}, Unconfirmed: new(sync.Map)}
		handle := consumer.Idempotent(store, func(id string) string { return id },
			func(ctx context.Context, id string) error {
				mu.Lock()
				defer mu.Unlock()
				// At most two crashes per message keeps the run short.
				crashes := crashBefore[id] + crashAfter[id]
				r := roll()
				if crashes < 2 && r < 0.05 {
					crashBefore[id]++
					store.Dead.Store(true)
					return crashstore.ErrCrashed
				}
				effects[id]++
				if crashes < 2 && r < 0.10 {
					crashAfter[id]++
					store.Dead.Store(true)
				}
				return nil
			}, consumer.Options[string]{ConfirmBudget: fleetConfirmBudget})
		inProgress := 0
		for {
			var id string
			select {
			case <-q.done:
				return false
			case id = <-q.ch:
			}
			err := handle(ctx, id)
			if store.Dead.Load() {
				q.redeliver(id, 0) // the connection dropped: the broker redelivers
				return true
			}
			switch {
			case err == nil:
				if roll() < 0.1 { // the ack was lost: delivered again
					q.redeliver(id, 0)
				} else {
					q.ack()
				}
			case errors.Is(err, idem.ErrInProgress):
				inProgress++
				q.redeliver(id, time.Duration(min(inProgress, 10))*10*time.Millisecond)
			default:
				t.Errorf("worker %s: message %s: %v", name, id, err)
				q.ack()
			}
		}
	}

	var wg sync.WaitGroup
	var restarts atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for gen := 0; worker(fmt.Sprintf("w%d.%d", w, gen)); gen++ {
				restarts.Add(1)
			}
		})
	}
	select {
	case <-q.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the queue did not drain in 20s: %d deliveries outstanding", q.outstanding.Load())
	}
	wg.Wait()

	var before, after, doubles int
	for _, id := range ids {
		before += crashBefore[id]
		after += crashAfter[id]
		doubles += effects[id] - 1
		if effects[id] != 1+crashAfter[id] {
			t.Errorf("%s: effect done %d times with %d crashes before it and %d between effect and confirm; "+
				"want 1 + (crashes after the effect, before the confirm) = %d",
				id, effects[id], crashBefore[id], crashAfter[id], 1+crashAfter[id])
		}
		if !confirmed(t, inspect, id) {
			t.Errorf("%s not confirmed after the queue drained", id)
		}
		n := int64(0)
		if v, ok := confirms.Load(id); ok {
			n = v.(*atomic.Int64).Load()
		}
		if n != 1 {
			t.Errorf("%s confirmed %d times; want exactly once", id, n)
		}
	}
	if doubles != after {
		t.Errorf("double effects %d != crashes after the effect and before the confirm %d: "+
			"every double effect must be explained by such a crash, and every such crash causes one", doubles, after)
	}
	if before == 0 || after == 0 {
		t.Errorf("crashes before the effect %d, after it %d: want both kinds exercised", before, after)
	}
	t.Logf("%d messages, %d crashes before the effect (done once), %d after it (double effects: %d), %d worker restarts",
		messages, before, after, doubles, restarts.Load())
}

// countConfirms counts successful Confirms per key.
type countConfirms struct {
	idem.Store
	n *sync.Map
}

func (c countConfirms) Confirm(ctx context.Context, l *idem.Lease, r []byte) error {
	err := c.Store.Confirm(ctx, l, r)
	if err == nil {
		v, _ := c.n.LoadOrStore(l.Key, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	return err
}
