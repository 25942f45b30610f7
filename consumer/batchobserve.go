package consumer

// What the Observer is told of a batch: each message's started context and
// its report, all sent when the batch ends.

import (
	"context"
	"time"

	"github.com/idemgo/idem"
)

// batchObs holds what the Observer is told of each message of a batch, and
// each message's started context. A nil *batchObs (no Observer) does
// nothing.
type batchObs struct {
	start time.Time
	ctxs  []context.Context
	reps  []report
}

// startBatch starts observing a batch of n messages.
func (c *config) startBatch(ctx context.Context, n int) *batchObs {
	ob := &batchObs{start: time.Now(), ctxs: make([]context.Context, n), reps: make([]report, n)}
	s, _ := c.observer.(idem.Starter)
	for i := range ob.ctxs {
		ob.ctxs[i] = ctx
		if s != nil {
			ob.ctxs[i] = s.Start(ctx, idem.OpMessage)
		}
	}
	return ob
}

// ctx is message i's context: the started one when observing, else ctx.
func (ob *batchObs) ctx(ctx context.Context, i int) context.Context {
	if ob == nil {
		return ctx
	}
	return ob.ctxs[i]
}

func (ob *batchObs) set(i int, key string, o idem.Outcome, err error) {
	if ob != nil {
		ob.reps[i] = report{key: key, outcome: o, takeOver: ob.reps[i].takeOver, err: err}
	}
}

// tookOver notes that message i's claim took its key over.
func (ob *batchObs) tookOver(i int, t bool) {
	if ob != nil {
		ob.reps[i].takeOver = t
	}
}

// endBatch reports every message of the batch.
func (c *config) endBatch(ob *batchObs) {
	for i, rep := range ob.reps {
		c.observe(ob.ctxs[i], rep, ob.start)
	}
}
