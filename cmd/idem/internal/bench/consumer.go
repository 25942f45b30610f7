package bench

import (
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	idemamqp "github.com/idemgo/idem/consumer/amqp"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/internal/redisadmin"
)

// GroupConsumer is the end-to-end consumer benchmark (RunConsumer): a
// broker's messages read with and without idem's consumer wrapper. It is
// not one of AllGroups: it measures with a loop of its own, and needs a
// broker.
const GroupConsumer = "consumer"

// Names of the consumer contenders; each idem contender is divided by the
// bare one of its broker that reads and acks as it does (Redis Streams:
// reads of a batch and one XACK per read for all three; RabbitMQ: one ack
// per delivery, or one multiple ack per batch).
const (
	NameStreamBare       = "Redis Streams: XREADGROUP + XACK (bare)"
	NameStreamPerMessage = "Redis Streams: idem per message (Idempotent)"
	NameStreamBatched    = "Redis Streams: idem batched (redisstream.Reader)"

	NameAMQPBare        = "RabbitMQ: Ack (bare)"
	NameAMQPPerMessage  = "RabbitMQ: idem per message (amqp.Handler)"
	NameAMQPBareBatched = "RabbitMQ: multiple Ack per batch (bare)"
	NameAMQPBatched     = "RabbitMQ: idem batched (consumer.Batch)"
)

// ConsumerEnv is what the consumer contenders run against.
type ConsumerEnv struct {
	// Redis holds the store's records and the stream. Required.
	Redis *redis.Client
	// AMQP is a RabbitMQ URL; "" leaves RabbitMQ's contenders out.
	AMQP string
	// BrokerPID is RabbitMQ's process (its beam.smp), whose CPU time
	// (/proc/PID/stat) is read around each round; 0 finds it by name when
	// exactly one beam.smp runs, negative does not read it.
	BrokerPID int
}

// ConsumerConfig is one consumer run.
type ConsumerConfig struct {
	Msgs      int     // messages per contender per round; default 20,000
	Rounds    int     // default 5
	Redeliver float64 // share of messages that repeat an earlier message's key; default 0.2
	Batch     int     // messages per read (XREADGROUP COUNT) and per idem batch; default 100
	Only      func(name string) bool
	Progress  func(format string, args ...any)
}

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	if c.Msgs == 0 {
		c.Msgs = 20_000
	}
	if c.Rounds == 0 {
		c.Rounds = 5
	}
	if c.Redeliver == 0 {
		c.Redeliver = 0.2
	}
	if c.Batch == 0 {
		c.Batch = 100
	}
	if c.Progress == nil {
		c.Progress = func(string, ...any) {}
	}
	return c
}

// ConsumerRow is one consumer contender's results; every slice holds one
// value per round.
type ConsumerRow struct {
	Name, Broker, Versus string
	Rate                 []float64 // messages per second
	Ratio                []float64 // Rate / the Versus row's Rate of the same round
	RedisCPU             []float64 // µs of Redis CPU per message
	BrokerCPU            []float64 // µs of the broker's CPU per message (RabbitMQ's); nil when not read
	ClientCPU            []float64 // µs of this process's CPU per message
}

// ConsumerReport is a consumer run's results.
type ConsumerReport struct {
	Config  ConsumerConfig
	Machine string
	Started time.Time
	Rows    []*ConsumerRow
}

// consumerRun is one contender's round: n messages waiting in the broker,
// handled counts the handler's runs.
type consumerRun struct {
	c       *redis.Client
	conn    *amqp091.Connection
	store   *idem.RedisStore
	name    string // the stream or queue
	n       int
	batch   int
	handled atomic.Int64
	// end, when set by the contender, is when its last message was acked:
	// the timed window ends there rather than when run returns.
	end time.Time
}

func (r *consumerRun) handle(context.Context) error { r.handled.Add(1); return nil }

type consumerContender struct {
	name, broker, versus string
	idem                 bool
	run                  func(ctx context.Context, r *consumerRun) error
}

var consumerContenders = []consumerContender{
	{name: NameStreamBare, broker: "redis", run: streamBare},
	{name: NameStreamPerMessage, broker: "redis", versus: NameStreamBare, idem: true, run: streamPerMessage},
	{name: NameStreamBatched, broker: "redis", versus: NameStreamBare, idem: true, run: streamBatched},
	{name: NameAMQPBare, broker: "amqp", run: amqpBare},
	{name: NameAMQPPerMessage, broker: "amqp", versus: NameAMQPBare, idem: true, run: amqpPerMessage},
	{name: NameAMQPBareBatched, broker: "amqp", run: amqpBareBatched},
	{name: NameAMQPBatched, broker: "amqp", versus: NameAMQPBareBatched, idem: true, run: amqpBatched},
}

// RunConsumer measures a consumer end to end: for each round and each
// contender, in an order that rotates from round to round, it fills a new
// stream (or queue) with cfg.Msgs messages, cfg.Redeliver of which repeat
// the key of a message shortly before them (a redelivery, or a producer's
// retry), and times reading, handling (a handler that does nothing) and
// acknowledging all of them, reading Redis's, the broker's and this
// process's CPU time before and after. Filling and cleaning up are outside
// the timed window. An idem contender whose handler did not run exactly
// once per distinct key fails the run.
func RunConsumer(ctx context.Context, e ConsumerEnv, cfg ConsumerConfig) (*ConsumerReport, error) {
	cfg = cfg.withDefaults()
	if e.Redis == nil {
		return nil, errors.New("bench: the consumer group needs a standalone Redis")
	}
	if cfg.Msgs < 1 || cfg.Rounds < 1 || cfg.Batch < 1 || cfg.Redeliver < 0 || cfg.Redeliver >= 1 {
		return nil, fmt.Errorf("bench: consumer: need msgs, rounds and batch ≥ 1 and 0 ≤ redeliver < 1 (have %d, %d, %d, %g)",
			cfg.Msgs, cfg.Rounds, cfg.Batch, cfg.Redeliver)
	}
	var sel []consumerContender
	for _, c := range consumerContenders {
		if (c.broker == "amqp" && e.AMQP == "") || (cfg.Only != nil && !cfg.Only(c.name)) {
			continue
		}
		sel = append(sel, c)
	}
	if len(sel) == 0 {
		return nil, errors.New("bench: no consumer contender selected")
	}
	var conn *amqp091.Connection
	if e.AMQP != "" {
		var err error
		if conn, err = amqp091.Dial(e.AMQP); err != nil {
			return nil, fmt.Errorf("bench: cannot reach RabbitMQ: %w", err)
		}
		defer conn.Close()
		if e.BrokerPID == 0 {
			e.BrokerPID = findBeam()
		}
	}
	prefix := fmt.Sprintf("bc%010x_", time.Now().UnixNano()&0xffffffffff)
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, _ = redisadmin.Unlink(ctx, e.Redis, prefix+"*")
	}()
	machine := machine(ctx, &Env{Redis: e.Redis})
	if conn != nil {
		if v, ok := conn.Properties["version"].(string); ok {
			machine += ", RabbitMQ " + v
		}
	}
	rep := &ConsumerReport{Config: cfg, Machine: machine, Started: time.Now()}
	stores := make([]*idem.RedisStore, len(sel))
	for i, c := range sel {
		rep.Rows = append(rep.Rows, &ConsumerRow{Name: c.name, Broker: c.broker, Versus: c.versus})
		s, err := idem.NewRedisStore(e.Redis, idem.RedisOptions{Prefix: prefix + "s" + strconv.Itoa(i) + ":", Retention: 10 * time.Minute})
		if err != nil {
			return nil, err
		}
		stores[i] = s
	}
	seq := 0
	one := func(i int, n int) (*consumerRun, time.Duration, [3]time.Duration, error) {
		seq++
		r := &consumerRun{c: e.Redis, conn: conn, store: stores[i], n: n, batch: cfg.Batch,
			name: prefix + "q" + strconv.Itoa(seq)}
		keys := consumerKeys(r.name, n, cfg.Redeliver)
		var err error
		if sel[i].broker == "redis" {
			err = fillStream(ctx, r, keys)
		} else {
			err = fillQueue(ctx, r, keys)
		}
		if err != nil {
			return nil, 0, [3]time.Duration{}, fmt.Errorf("bench: %s: filling: %w", sel[i].name, err)
		}
		var cpu0, cpu1 [3]time.Duration
		readCPU := func(cpu *[3]time.Duration) error {
			var err error
			if cpu[0], err = redisCPU(ctx, e.Redis); err != nil {
				return err
			}
			cpu[1], _ = procStatCPU(e.BrokerPID)
			cpu[2], _ = processCPU()
			return nil
		}
		if err := readCPU(&cpu0); err != nil {
			return nil, 0, cpu0, err
		}
		start := time.Now()
		if err := sel[i].run(ctx, r); err != nil {
			return nil, 0, cpu0, fmt.Errorf("bench: %s: %w", sel[i].name, err)
		}
		d := time.Since(start)
		if !r.end.IsZero() {
			d = r.end.Sub(start)
		}
		if err := readCPU(&cpu1); err != nil {
			return nil, 0, cpu0, err
		}
		want := int64(n)
		if sel[i].idem {
			want = int64(distinct(keys))
		}
		if got := r.handled.Load(); got != want {
			return nil, 0, cpu0, fmt.Errorf("bench: %s: the handler ran %d times for %d messages; want %d", sel[i].name, got, n, want)
		}
		if sel[i].broker == "redis" {
			err = e.Redis.Del(ctx, r.name).Err()
		} else {
			err = deleteQueue(r)
		}
		if err == nil {
			_, err = redisadmin.Unlink(ctx, e.Redis, prefix+"s*")
		}
		for k := range cpu1 {
			cpu1[k] -= cpu0[k]
		}
		return r, d, cpu1, err
	}
	// A warm-up run each: the store's first contact (its probe, SCRIPT
	// LOAD), the connections, the code paths.
	for i := range sel {
		if _, _, _, err := one(i, min(cfg.Msgs, 2000)); err != nil {
			return nil, err
		}
	}
	for round := range cfg.Rounds {
		for k := range sel {
			i := (k + round) % len(sel)
			_, d, cpu, err := one(i, cfg.Msgs)
			if err != nil {
				return nil, err
			}
			row := rep.Rows[i]
			n := float64(cfg.Msgs)
			row.Rate = append(row.Rate, n/d.Seconds())
			row.RedisCPU = append(row.RedisCPU, float64(cpu[0].Microseconds())/n)
			if sel[i].broker == "amqp" && e.BrokerPID > 0 {
				row.BrokerCPU = append(row.BrokerCPU, float64(cpu[1].Microseconds())/n)
			}
			row.ClientCPU = append(row.ClientCPU, float64(cpu[2].Microseconds())/n)
			cfg.Progress("consumer round %d/%d %-52s %10.0f msgs/s", round+1, cfg.Rounds, sel[i].name, n/d.Seconds())
		}
		// Ratios within the round just finished: both figures seconds apart.
		for _, row := range rep.Rows {
			if row.Versus == "" {
				continue
			}
			if v := rep.row(row.Versus); v != nil && len(v.Rate) == len(row.Rate) {
				row.Ratio = append(row.Ratio, row.Rate[len(row.Rate)-1]/v.Rate[len(v.Rate)-1])
			}
		}
	}
	return rep, nil
}

func (rep *ConsumerReport) row(name string) *ConsumerRow {
	for _, r := range rep.Rows {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// consumerKeys returns the keys of n messages, a share redeliver of which
// repeat the key of one of the 200 messages before them, spread evenly.
func consumerKeys(prefix string, n int, redeliver float64) []string {
	rng := rand.New(rand.NewPCG(uint64(n), 47))
	keys := make([]string, n)
	for i := range keys {
		if i > 0 && int(float64(i+1)*redeliver) > int(float64(i)*redeliver) {
			keys[i] = keys[i-1-rng.IntN(min(i, 200))]
			continue
		}
		keys[i] = prefix + "/" + strconv.Itoa(i)
	}
	return keys
}

func distinct(keys []string) int {
	m := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		m[k] = struct{}{}
	}
	return len(m)
}

// fillStream adds one entry per key (field id) to a new stream and creates
// its group "g" at its start.
func fillStream(ctx context.Context, r *consumerRun, keys []string) error {
	for i := 0; i < len(keys); i += 1000 {
		p := r.c.Pipeline()
		for _, k := range keys[i:min(len(keys), i+1000)] {
			p.XAdd(ctx, &redis.XAddArgs{Stream: r.name, Values: []any{"id", k, "body", "x"}})
		}
		if _, err := p.Exec(ctx); err != nil {
			return err
		}
	}
	return r.c.XGroupCreateMkStream(ctx, r.name, "g", "0").Err()
}

func (r *consumerRun) read(ctx context.Context) ([]redis.XMessage, error) {
	ss, err := r.c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c",
		Streams: []string{r.name, ">"}, Count: int64(r.batch), Block: time.Second}).Result()
	if err != nil {
		return nil, err
	}
	return ss[0].Messages, nil
}

func (r *consumerRun) ack(ctx context.Context, ms []redis.XMessage) error {
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return r.c.XAck(ctx, r.name, "g", ids...).Err()
}

func streamBare(ctx context.Context, r *consumerRun) error {
	for done := 0; done < r.n; {
		ms, err := r.read(ctx)
		if err != nil {
			return err
		}
		for range ms {
			_ = r.handle(ctx)
		}
		if err := r.ack(ctx, ms); err != nil {
			return err
		}
		done += len(ms)
	}
	return nil
}

func streamKey(m redis.XMessage) string { s, _ := m.Values["id"].(string); return s }

// streamPerMessage is the bare loop with each entry handled through
// consumer.Idempotent: a claim and a confirm round trip per entry.
func streamPerMessage(ctx context.Context, r *consumerRun) error {
	h := consumer.Idempotent(r.store, streamKey, func(ctx context.Context, _ redis.XMessage) error { return r.handle(ctx) })
	for done := 0; done < r.n; {
		ms, err := r.read(ctx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if err := h(ctx, m); err != nil {
				return err
			}
		}
		if err := r.ack(ctx, ms); err != nil {
			return err
		}
		done += len(ms)
	}
	return nil
}

// streamBatched runs the Redis Streams adapter itself until every entry
// is acked. Its time ends with the last ack: stopping the Reader then
// waits out the XREADGROUP it has begun, blocked for up to its Block (1s
// here), since go-redis does not interrupt a blocked read when its
// context ends; counted in, that wait was most of a round's time.
func streamBatched(ctx context.Context, r *consumerRun) error {
	var acked, other atomic.Int64
	all := make(chan struct{})
	var end time.Time
	rd, err := redisstream.NewReader(r.c, r.store, func(ctx context.Context, _ redis.XMessage) error { return r.handle(ctx) },
		redisstream.Options{Stream: r.name, Group: "g", Consumer: "c", KeyField: "id", Count: r.batch,
			Block: time.Second, Logger: quietLogger,
			OnSettle: func(_ *redis.XMessage, s redisstream.Settlement) {
				if s.Action != redisstream.Ack {
					other.Add(1)
				}
				if acked.Add(1) == int64(r.n) {
					end = time.Now()
					close(all)
				}
			}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rd.Run(ctx) }()
	select {
	case <-all:
		r.end = end // written before all was closed
	case err := <-done:
		cancel()
		return fmt.Errorf("the reader stopped: %w", err)
	}
	cancel()
	<-done
	if n := other.Load(); n > 0 {
		return fmt.Errorf("%d entries were not acked as done", n)
	}
	return nil
}

var quietLogger = slog.New(slog.DiscardHandler)

// prefetch bounds each RabbitMQ contender's unacknowledged deliveries:
// two batches, so that the batched contender has the next batch on its way
// while it handles one.
func (r *consumerRun) prefetch() int { return 2 * r.batch }

// fillQueue declares a queue and publishes one message per key (its
// MessageId) to it, then waits until the broker counts them all.
func fillQueue(ctx context.Context, r *consumerRun, keys []string) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(r.name, false, false, false, false, nil); err != nil {
		return err
	}
	for _, k := range keys {
		if err := ch.PublishWithContext(ctx, "", r.name, false, false, amqp091.Publishing{MessageId: k, Body: []byte("x")}); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		q, err := ch.QueueDeclarePassive(r.name, false, false, false, false, nil)
		if err != nil {
			return err
		}
		if q.Messages == len(keys) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("queue %s holds %d messages a minute after publishing %d", r.name, q.Messages, len(keys))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func deleteQueue(r *consumerRun) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueueDelete(r.name, false, false, false)
	return err
}

// consume opens a channel with the contenders' prefetch, consumes the
// queue and calls f until it returns done or an error.
func consume(ctx context.Context, r *consumerRun, f func(ch *amqp091.Channel, ds <-chan amqp091.Delivery) error) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Qos(r.prefetch(), 0, false); err != nil {
		return err
	}
	ds, err := ch.ConsumeWithContext(ctx, r.name, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	return f(ch, ds)
}

func next(ctx context.Context, ds <-chan amqp091.Delivery) (amqp091.Delivery, error) {
	select {
	case d, ok := <-ds:
		if !ok {
			return d, errors.New("the channel closed")
		}
		return d, nil
	case <-ctx.Done():
		return amqp091.Delivery{}, ctx.Err()
	case <-time.After(10 * time.Second):
		return amqp091.Delivery{}, errors.New("no delivery for 10s")
	}
}

func amqpBare(ctx context.Context, r *consumerRun) error {
	return consume(ctx, r, func(_ *amqp091.Channel, ds <-chan amqp091.Delivery) error {
		for range r.n {
			d, err := next(ctx, ds)
			if err != nil {
				return err
			}
			_ = r.handle(ctx)
			if err := d.Ack(false); err != nil {
				return err
			}
		}
		return nil
	})
}

// amqpPerMessage runs the RabbitMQ adapter itself on each delivery.
func amqpPerMessage(ctx context.Context, r *consumerRun) error {
	var other atomic.Int64
	h := idemamqp.Handler(r.store, func(ctx context.Context, _ amqp091.Delivery) error { return r.handle(ctx) },
		idemamqp.Options{Logger: quietLogger, OnSettle: func(_ *amqp091.Delivery, s idemamqp.Settlement) {
			if s.Action != idemamqp.Ack {
				other.Add(1)
			}
		}})
	err := consume(ctx, r, func(_ *amqp091.Channel, ds <-chan amqp091.Delivery) error {
		for range r.n {
			d, err := next(ctx, ds)
			if err != nil {
				return err
			}
			h(ctx, d)
		}
		return nil
	})
	if err == nil && other.Load() > 0 {
		err = fmt.Errorf("%d deliveries were not acked", other.Load())
	}
	return err
}

// batchLinger is how long a RabbitMQ batch waits, after its first
// delivery, for the rest: with a prefetch of two batches, the broker has
// the next batch on its way.
const batchLinger = 5 * time.Millisecond

// amqpBatched handles amqpBatches' batches with consumer.Batch (a claim
// and a confirm round trip per batch): the form a RabbitMQ consumer that
// batches would take (the amqp adapter handles one delivery at a time).
func amqpBatched(ctx context.Context, r *consumerRun) error {
	h := consumer.Batch(r.store, func(d amqp091.Delivery) string { return d.MessageId },
		func(ctx context.Context, _ amqp091.Delivery) error { return r.handle(ctx) })
	return amqpBatches(ctx, r, func(batch []amqp091.Delivery) error {
		for i, err := range h(ctx, batch) {
			if consumer.ActionFor(err) != consumer.Ack {
				return fmt.Errorf("delivery %q: %w", batch[i].MessageId, err)
			}
		}
		return nil
	})
}

// amqpBareBatched is amqpBatched without idem: the same batches, each
// delivery handled, one multiple ack per batch.
func amqpBareBatched(ctx context.Context, r *consumerRun) error {
	return amqpBatches(ctx, r, func(batch []amqp091.Delivery) error {
		for range batch {
			_ = r.handle(ctx)
		}
		return nil
	})
}

// amqpBatches gathers up to a batch of deliveries (waiting up to
// batchLinger after the first), hands them to f and acks them with one
// multiple ack, until r.n deliveries are acked.
func amqpBatches(ctx context.Context, r *consumerRun, f func([]amqp091.Delivery) error) error {
	return consume(ctx, r, func(_ *amqp091.Channel, ds <-chan amqp091.Delivery) error {
		batch := make([]amqp091.Delivery, 0, r.batch)
		for done := 0; done < r.n; {
			d, err := next(ctx, ds)
			if err != nil {
				return err
			}
			batch = append(batch[:0], d)
			// Deliveries arrive one by one: a batch waits up to
			// batchLinger after its first for the rest.
			linger := time.NewTimer(batchLinger)
		gather:
			for len(batch) < r.batch && done+len(batch) < r.n {
				select {
				case d, ok := <-ds:
					if !ok {
						linger.Stop()
						return errors.New("the channel closed")
					}
					batch = append(batch, d)
				case <-linger.C:
					break gather
				}
			}
			linger.Stop()
			if err := f(batch); err != nil {
				return err
			}
			if err := batch[len(batch)-1].Ack(true); err != nil {
				return err
			}
			done += len(batch)
		}
		return nil
	})
}

// findBeam returns the pid of the one beam.smp (RabbitMQ's Erlang VM)
// running, or -1 when there is none or more than one.
func findBeam() int {
	ms, _ := filepath.Glob("/proc/[0-9]*/comm")
	pid := -1
	for _, m := range ms {
		b, err := os.ReadFile(m)
		if err != nil || strings.TrimSpace(string(b)) != "beam.smp" {
			continue
		}
		if pid != -1 {
			return -1
		}
		pid, _ = strconv.Atoi(filepath.Base(filepath.Dir(m)))
	}
	return pid
}

// procStatCPU returns the user and system CPU time of process pid, from
// /proc/PID/stat (in clock ticks, 100 a second on Linux).
func procStatCPU(pid int) (time.Duration, bool) {
	if pid <= 0 {
		return 0, false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// count fields after its closing one. utime and stime are fields 14
	// and 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+st) * 10 * time.Millisecond, true
}

// spread formats the median of xs with its lowest and highest value.
func spread(xs []float64, f func(float64) string) string {
	if len(xs) == 0 {
		return "–"
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return fmt.Sprintf("%s <sub>%s–%s</sub>", f(median(s)), f(s[0]), f(s[len(s)-1]))
}

// WriteMarkdown writes the consumer run's table: per contender the median
// messages per second, the median of per-round ratios to its broker's bare
// consumer, and CPU per message, each with the lowest and highest round.
func (rep *ConsumerReport) WriteMarkdown(w io.Writer) error {
	c := rep.Config
	var b strings.Builder
	fmt.Fprintf(&b, "Consumer end to end, run of %s on %s. One reader; %d rounds of %d messages per contender, contenders alternating; "+
		"%.0f%% of the messages repeat the key of one of the 200 before them (a redelivery); reads and idem batches of %d; "+
		"a handler that does nothing. Median over rounds, in small print the lowest and highest round; "+
		"CPU per message is a round's CPU divided by its messages: Redis's (INFO cpu), RabbitMQ's (its beam.smp, /proc/PID/stat, 10 ms ticks) "+
		"and this process's (getrusage).\n\n",
		rep.Started.UTC().Format("2006-01-02 15:04 MST"), rep.Machine, c.Rounds, c.Msgs, 100*c.Redeliver, c.Batch)
	b.WriteString("| contender | msgs/s | ÷ bare | Redis CPU µs/msg | broker CPU µs/msg | client CPU µs/msg |\n|---|--:|--:|--:|--:|--:|\n")
	num := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
	ratio := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "×" }
	for _, r := range rep.Rows {
		redisCell := spread(r.RedisCPU, num)
		if r.Broker == "redis" {
			redisCell += " (stream and store)"
		}
		fmt.Fprintf(&b, "| **%s** | %s | %s | %s | %s | %s |\n", r.Name, spread(r.Rate, rate), spread(r.Ratio, ratio),
			redisCell, spread(r.BrokerCPU, num), spread(r.ClientCPU, num))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteSVG draws the consumer run as horizontal bars: median messages per
// second of each contender, its ratio to its broker's bare consumer
// written beside it.
func (rep *ConsumerReport) WriteSVG(w io.Writer) error {
	if len(rep.Rows) == 0 {
		return errors.New("bench: nothing to chart")
	}
	hi := 0.0
	for _, r := range rep.Rows {
		hi = math.Max(hi, median(slices.Clone(r.Rate)))
	}
	const (
		width, left, right, top, bar, gap = 960, 360, 140, 40, 22, 10
	)
	height := top + len(rep.Rows)*(bar+gap) + 50
	pw := float64(width - left - right)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="10" y="22" font-size="15">Consumer end to end: messages per second, one reader, %.0f%% redeliveries (median of %d rounds; ratio to the bare consumer)</text>`+"\n",
		100*rep.Config.Redeliver, rep.Config.Rounds)
	broker := ""
	for i, r := range rep.Rows {
		y := float64(top + i*(bar+gap))
		if r.Broker != broker {
			broker = r.Broker
		}
		color := "#7f7f7f"
		if r.Versus != "" {
			color = palette[0]
			if strings.Contains(r.Name, "batched") {
				color = palette[2]
			}
		}
		v := median(slices.Clone(r.Rate))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-8, y+bar*0.7, html.EscapeString(r.Name))
		fmt.Fprintf(&b, `<rect x="%d" y="%.1f" width="%.1f" height="%d" fill="%s"/>`+"\n", left, y, v/hi*pw, bar, color)
		label := rate(v) + "/s"
		if len(r.Ratio) > 0 {
			label += fmt.Sprintf(" (%.2f×)", median(slices.Clone(r.Ratio)))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", float64(left)+v/hi*pw+6, y+bar*0.7, label)
	}
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#888888"/>`+"\n", left, left, top-4, height-46)
	fmt.Fprintf(&b, `<text x="10" y="%d" fill="#555555">%s</text>`+"\n", height-20, html.EscapeString(rep.Machine))
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
