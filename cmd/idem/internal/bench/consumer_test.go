package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/redisadmin"
	"github.com/idemgo/idem/internal/testing/testenv"
)

func TestConsumerKeysRedeliver(t *testing.T) {
	keys := consumerKeys("q", 10_000, 0.2)
	if got := distinct(keys); got != 8000 {
		t.Errorf("distinct keys of 10,000 with 20%% redelivered = %d; want 8000", got)
	}
	if keys[0] != "q/0" {
		t.Errorf("keys[0] = %q; want q/0 (the first message is never a repeat)", keys[0])
	}
}

func TestProcStatCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	if _, ok := procStatCPU(os.Getpid()); !ok {
		t.Errorf("procStatCPU(own pid) = _, false; want this process's CPU time")
	}
	if _, ok := procStatCPU(-1); ok {
		t.Errorf("procStatCPU(-1) = _, true; want false")
	}
}

// TestRunConsumer runs the consumer benchmark briefly on the real Redis
// (and RabbitMQ when IDEM_AMQP_URL names one): every contender must
// finish with each distinct key handled once (RunConsumer checks), and the
// report must carry a rate, a ratio to bare and the CPU figures.
func TestRunConsumer(t *testing.T) {
	c := testenv.Redis(t)
	amqpURL := os.Getenv("IDEM_AMQP_URL")
	rep, err := RunConsumer(context.Background(), ConsumerEnv{Redis: c, AMQP: amqpURL, BrokerPID: -1},
		ConsumerConfig{Msgs: 500, Rounds: 2})
	if err != nil {
		t.Fatalf("RunConsumer: %v", err)
	}
	want := 3
	if amqpURL != "" {
		want = 7
	}
	if len(rep.Rows) != want {
		t.Fatalf("rows = %d; want %d", len(rep.Rows), want)
	}
	for _, r := range rep.Rows {
		if len(r.Rate) != 2 || len(r.ClientCPU) != 2 || len(r.RedisCPU) != 2 {
			t.Errorf("%s: %d rates, %d client and %d Redis CPU figures; want 2 each (one per round)", r.Name, len(r.Rate), len(r.ClientCPU), len(r.RedisCPU))
		}
		if (r.Versus != "") != (len(r.Ratio) == 2) {
			t.Errorf("%s (versus %q): %d ratios; want 2 exactly when it has a versus", r.Name, r.Versus, len(r.Ratio))
		}
	}
	var md, svg bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil || !strings.Contains(md.String(), NameStreamBatched) {
		t.Errorf("WriteMarkdown = %v, %q; want a table naming %q", err, md.String(), NameStreamBatched)
	}
	if err := rep.WriteSVG(&svg); err != nil || !strings.HasPrefix(svg.String(), "<svg") {
		t.Errorf("WriteSVG = %v, %.40q; want an SVG", err, svg.String())
	}
}

// TestStreamBatchedEndsAtLastAck checks that the batched Streams
// contender's time ends with its last ack, not once the Reader has
// stopped: stopping waits out the XREADGROUP it has begun (Block, 1s),
// which go-redis does not interrupt, and which once made up most of a
// round's time.
func TestStreamBatchedEndsAtLastAck(t *testing.T) {
	c := testenv.Redis(t)
	ctx := context.Background()
	pfx := fmt.Sprintf("idemtest:bench:%d:", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = redisadmin.Unlink(context.Background(), c, pfx+"*") })
	s, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: pfx + "s:"})
	if err != nil {
		t.Fatal(err)
	}
	r := &consumerRun{c: c, store: s, name: pfx + "q", n: 300, batch: 100}
	if err := fillStream(ctx, r, consumerKeys(r.name, r.n, 0.2)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := streamBatched(ctx, r); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if r.end.IsZero() || r.end.Before(start) || r.end.After(stopped) {
		t.Errorf("end = %v; want the last ack's time, between the start %v and the Reader's stop %v", r.end, start, stopped)
	}
}
