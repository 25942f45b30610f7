package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
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

var quietLogger = slog.New(slog.DiscardHandler)
