package main

import (
	"math/rand/v2"
	"sort"
	"sync"
	"time"
)

// crashKind says where a handler run crashes, if it does.
type crashKind uint8

const (
	noCrash     crashKind = iota
	crashBefore           // before the effect: the take-over applies it once
	crashAfter            // after the effect, before the confirm: the take-over applies it again
)

// maxCrashes bounds the crashes planned for one message, so that every
// message is surely done after its take-overs: at most
// idem.DefaultMaxTakeOvers, so that none is quarantined but the poison
// messages.
const maxCrashes = 3

// plan is everything random about a demo run, drawn from its seed: how many
// copies of each message the queue holds, where they sit in the queue, and
// which handler runs crash. The goroutines' interleaving is not part of it,
// so two runs of one seed have the same plan but may count duplicates
// skipped and in-progress redeliveries differently.
type plan struct {
	order   []int         // the queue's initial deliveries, as message indexes
	crashes [][]crashKind // crashes[m][n]: how message m's n-th handler run crashes (none past the end)
	// messages is the count of ordinary messages; those from it on, one
	// copy each, are poison: every handler run of one crashes.
	messages int
}

// dupWindow is how far back in the queue a duplicate copy may land, in
// deliveries: near enough that some copies arrive while the original is
// still being handled (in-progress), far enough that most find it done.
const dupWindow = 40

func newPlan(messages, poison int, dupRate, crashRate float64, seed uint64) *plan {
	r := rand.New(rand.NewPCG(seed, 0x1de3))
	p := &plan{crashes: make([][]crashKind, messages), messages: messages}
	type slot struct {
		msg int
		pos float64
	}
	var slots []slot
	for m := range messages {
		slots = append(slots, slot{m, float64(m)})
		// Each further copy with probability dupRate, up to four copies: an
		// at-least-once broker that redelivers after lost acks.
		for c := 1; c < 4 && r.Float64() < dupRate; c++ {
			slots = append(slots, slot{m, float64(m) + r.Float64()*dupWindow})
		}
		for len(p.crashes[m]) < maxCrashes && r.Float64() < crashRate {
			p.crashes[m] = append(p.crashes[m], crashKind(1+r.IntN(2)))
		}
	}
	// The poison messages from a stream of their own, so that a seed's
	// plan of the ordinary messages is the same with or without them.
	pr := rand.New(rand.NewPCG(seed, 0x9015))
	for m := messages; m < messages+poison; m++ {
		slots = append(slots, slot{m, pr.Float64() * float64(messages)})
	}
	sort.SliceStable(slots, func(i, j int) bool { return slots[i].pos < slots[j].pos })
	p.order = make([]int, len(slots))
	for i, s := range slots {
		p.order[i] = s.msg
	}
	return p
}

// crashAt returns how message m's n-th handler run (from 0) crashes: a
// poison message's, every one before the effect, as a message that kills
// whoever parses it.
func (p *plan) crashAt(m, n int) crashKind {
	if p.poison(m) {
		return crashBefore
	}
	if n < len(p.crashes[m]) {
		return p.crashes[m][n]
	}
	return noCrash
}

// poison reports whether message m is a poison message.
func (p *plan) poison(m int) bool { return m >= p.messages }

// queue is an in-process at-least-once queue: a delivery leaves it when a
// worker takes it and is settled by ack (done) or redeliver (back into the
// queue, now or after a delay). The queue is drained when every delivery
// was acked.
type queue struct {
	mu          sync.Mutex
	cond        sync.Cond
	items       []int // message indexes, front first
	outstanding int   // deliveries not yet acked, queued or in flight
	closed      bool
}

func newQueue(order []int) *queue {
	q := &queue{items: append([]int(nil), order...), outstanding: len(order)}
	q.cond.L = &q.mu
	return q
}

// next blocks until a delivery is available and returns it, or returns
// false when the queue is drained or closed.
func (q *queue) next() (int, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && q.outstanding > 0 && !q.closed {
		q.cond.Wait()
	}
	if len(q.items) == 0 || q.closed {
		return 0, false
	}
	m := q.items[0]
	q.items = q.items[1:]
	return m, true
}

// ack settles a delivery as done.
func (q *queue) ack() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.outstanding--
	if q.outstanding == 0 {
		q.cond.Broadcast()
	}
}

// redeliver puts message m back at the end of the queue after delay, as a
// broker does with a nacked delivery or one whose consumer died.
func (q *queue) redeliver(m int, delay time.Duration) {
	push := func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.items = append(q.items, m)
		q.cond.Signal()
	}
	if delay <= 0 {
		push()
		return
	}
	time.AfterFunc(delay, push)
}

// close wakes every worker and ends the run (a timeout or an interrupt).
func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.cond.Broadcast()
}
