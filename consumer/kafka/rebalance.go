package kafka

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
)

// assigned starts the work contexts of newly assigned partitions.
func (c *Consumer) assigned(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, parts := range ps {
		for _, n := range parts {
			ctx, cancel := context.WithCancel(c.base)
			c.parts[tp{t, n}] = &part{ctx: ctx, cancel: cancel}
		}
	}
}

// revoked ends the revoked partitions' work, waits for it, and commits
// their marked offsets, before the group hands the partitions on.
func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, ps map[string][]int32) {
	c.drop(ps)
	cctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	if err := cl.CommitMarkedOffsets(cctx); err != nil {
		c.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem/kafka: committing the revoked partitions' offsets failed; their next owner refetches the records as duplicates",
			slog.Any("err", err))
	}
}

// lost ends the lost partitions' work and waits for it; their offsets
// cannot be committed any more.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, ps map[string][]int32) { c.drop(ps) }

// drop cancels the partitions' work, forgets them, and waits for their
// work in flight to return.
func (c *Consumer) drop(ps map[string][]int32) {
	c.mu.Lock()
	c.revokes++
	var gone []*part
	for t, parts := range ps {
		for _, n := range parts {
			k := tp{t, n}
			c.gone[k] = c.revokes
			if p := c.parts[k]; p != nil {
				p.cancel()
				gone = append(gone, p)
				delete(c.parts, k)
			}
		}
	}
	c.mu.Unlock()
	for _, p := range gone {
		p.wg.Wait()
	}
}
