package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/consumer"
	idemjs "github.com/idemgo/idem/consumer/jetstream"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fleetConfirmBudget is how long the wrapper retries a Confirm: half the
// 300 ms lease. A crashed process's confirms fail at once and give up at
// the end of it; a live one's must not time out on a loaded machine (at
// 20 ms, a CI run had confirms cut off, work done and not recorded, and
// so double effects no crash explained).
const fleetConfirmBudget = 150 * time.Millisecond

// A fleet of 4 consumer processes on one durable pull consumer, over a
// stream where every message is published at least twice (a producer's
// retries, keyed by an Order-Id header: under Nats-Msg-Id, JetStream's
// Duplicates window would drop the copies before idem saw them), while
// processes are stopped mid-handler (their context cancelled: the handler
// returns, its claim is forgotten, the message nakked) and crash
// mid-handler (store and connection stop answering: the lease is
// abandoned, nothing is settled, the connection is closed and the broker
// redelivers after AckWait). Each stopped or crashed process is replaced by
// a new one with a new connection. The ledger must show every message's
// effect once, plus one extra effect per confirmation that a crash
// prevented after the handler had applied the effect, no more, no less; and
// nothing may be acked without its work confirmed or found done (0 lost).
//
// It runs twice: messages taken one at a time from Consume (Handle), and
// fetched 16 at a time (HandleBatch), where a crash after the effect also
// prevents the confirmation of the rest of its round.
func TestFleetJetStream(t *testing.T) {
	t.Run("consume", func(t *testing.T) { testFleet(t, 0) })
	t.Run("fetch=16", func(t *testing.T) { testFleet(t, 16) })
}

// testFleet runs the fleet, fetching batches of fetch messages (0:
// Consume, one message at a time).
func testFleet(t *testing.T, fetch int) {
	const (
		messages  = 300
		processes = 4
		ttl       = 500 * time.Millisecond // idem.MinLeaseTTL: idem's lease, and the consumer's AckWait
	)
	rc := testRedis(t)
	srv := startServer(t)
	_, js := connect(t, srv)
	cons := newConsumer(t, js, ttl)
	keys := make([]string, 0, messages*3)
	for i := range messages {
		k := fmt.Sprintf("msg-%03d", i)
		keys = append(keys, k, k) // every message published at least twice
		if rand.Float64() < 0.3 {
			keys = append(keys, k)
		}
	}
	rand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	publish(t, js, "Order-Id", keys...)
	pfx := prefix(t)

	var mu sync.Mutex
	effects := map[string]int{}
	faults := map[string]int{} // stops and crashes per message, at most 2
	var stops, crashBefore, crashAfter int
	var unconfirmed sync.Map // crashLease -> struct{}: a success whose Confirm met a dead store
	var ackedUndone atomic.Int64

	ctx, cancelAll := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelAll()
	// process runs one consumer process until it is stopped or crashes, or
	// the fleet is done.
	process := func(name string) {
		pctx, stop := context.WithCancel(ctx)
		defer stop()
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			t.Error(err)
			return
		}
		defer nc.Close()
		pjs, err := jetstream.New(nc)
		if err != nil {
			t.Error(err)
			return
		}
		pcons, err := pjs.Consumer(pctx, "S", "c")
		if err != nil {
			if pctx.Err() == nil {
				t.Error(err)
			}
			return
		}
		inspect := newStore(t, rc, pfx, name+".inspect", ttl)
		store := &crashStore{Store: newStore(t, rc, pfx, name, ttl), Unconfirmed: &unconfirmed}
		h := func(hctx context.Context, m jetstream.Msg) error {
			if err := hctx.Err(); err != nil {
				return err // a handler that sees its context end does no more
			}
			k := m.Headers().Get("Order-Id")
			mu.Lock()
			defer mu.Unlock()
			r := rand.Float64()
			few := faults[k] < 2
			switch {
			case few && r < 0.03:
				faults[k]++
				stops++
				stop() // stopped mid-handler: it returns the context's error
				return hctx.Err()
			case few && r < 0.06:
				faults[k]++
				crashBefore++
				store.Dead.Store(true)
				stop()
				return errCrashed
			}
			effects[k]++
			if few && r < 0.09 {
				faults[k]++
				crashAfter++
				store.Dead.Store(true) // the effect is applied; the confirm will not be
				stop()
			}
			return nil
		}
		hd, err := idemjs.NewHandler(store, h, idemjs.Options{KeyHeader: "Order-Id",
			MinDelay: 10 * time.Millisecond, MaxDelay: ttl / 2, ProgressInterval: ttl / 3,
			ConfirmBudget: fleetConfirmBudget, Logger: quiet,
			OnSettle: func(m jetstream.Msg, s idemjs.Settlement) {
				if s.Action != idemjs.Ack || s.SettleErr != nil {
					return
				}
				// Acked: its work must be confirmed (or found done) by now.
				rec, err := inspect.Lookup(context.Background(), m.Headers().Get("Order-Id"))
				if err != nil || !rec.Confirmed {
					if !errors.Is(s.Err, consumer.ErrNotRecorded) {
						ackedUndone.Add(1)
					}
				}
			}})
		if err != nil {
			t.Error(err)
			return
		}
		wrap := func(m jetstream.Msg) jetstream.Msg { return &crashMsg{Msg: m, dead: &store.Dead} }
		if fetch > 0 {
			for pctx.Err() == nil {
				batch, err := pcons.Fetch(fetch, jetstream.FetchMaxWait(50*time.Millisecond))
				if err != nil {
					continue
				}
				var ms []jetstream.Msg
				for m := range batch.Messages() {
					ms = append(ms, wrap(m))
				}
				hd.HandleBatch(pctx, ms)
			}
			return
		}
		cc, err := pcons.Consume(func(m jetstream.Msg) { hd.Handle(pctx, wrap(m)) }, jetstream.PullMaxMessages(16))
		if err != nil {
			if pctx.Err() == nil {
				t.Error(err)
			}
			return
		}
		<-pctx.Done()
		cc.Stop()
		<-cc.Closed()
	}
	var wg sync.WaitGroup
	var restarts atomic.Int64
	for p := range processes {
		wg.Go(func() {
			for gen := 0; ctx.Err() == nil; gen++ {
				process(fmt.Sprintf("p%d.%d", p, gen))
				restarts.Add(1)
			}
		})
	}
	// Done when the consumer has delivered every message and none awaits
	// its ack.
	for {
		info, err := cons.Info(context.Background())
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Stream >= uint64(len(keys)) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the consumer did not drain in 60s: %+v, %v", info, err)
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
		k := fmt.Sprintf("msg-%03d", i)
		doubles += effects[k] - 1
		after += prevented[k]
		if effects[k] != 1+prevented[k] {
			t.Errorf("%s: effect applied %d times, %d confirmations prevented by a crash after it; want 1 + %d",
				k, effects[k], prevented[k], prevented[k])
		}
		if rec, err := inspect.Lookup(context.Background(), k); err != nil || !rec.Confirmed {
			t.Errorf("%s: Lookup = %+v, %v; want confirmed (acked without its work confirmed: lost)", k, rec, err)
		}
	}
	if n := ackedUndone.Load(); n != 0 {
		t.Errorf("%d messages acked before their work was confirmed or found done; want 0", n)
	}
	if doubles != after {
		t.Errorf("double effects %d != confirmations prevented by a crash after the effect %d", doubles, after)
	}
	if stops == 0 || crashBefore == 0 || after == 0 {
		t.Errorf("stops %d, crashes before the effect %d, confirmations prevented %d: want every fault exercised",
			stops, crashBefore, after)
	}
	t.Logf("%d messages in %d publishes (every one at least twice), %d processes; %d stopped mid-handler, "+
		"%d crashed before the effect, %d after it, which prevented %d confirmations = %d double effects; "+
		"0 acked unconfirmed; %d processes replaced",
		messages, len(keys), processes, stops, crashBefore, crashAfter, after, doubles, restarts.Load()-processes)
}

// crashMsg is a message as the process sees it: dead with its store, so
// that a crashed process settles nothing and sends no InProgress.
type crashMsg struct {
	jetstream.Msg
	dead *atomic.Bool
}

func (m *crashMsg) Ack() error        { return m.or(m.Msg.Ack) }
func (m *crashMsg) Nak() error        { return m.or(m.Msg.Nak) }
func (m *crashMsg) InProgress() error { return m.or(m.Msg.InProgress) }
func (m *crashMsg) Term() error       { return m.or(m.Msg.Term) }
func (m *crashMsg) NakWithDelay(d time.Duration) error {
	return m.or(func() error { return m.Msg.NakWithDelay(d) })
}
func (m *crashMsg) TermWithReason(r string) error {
	return m.or(func() error { return m.Msg.TermWithReason(r) })
}

func (m *crashMsg) or(f func() error) error {
	if m.dead.Load() {
		return errCrashed
	}
	return f()
}
