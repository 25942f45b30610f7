package idemotel_test

import (
	"context"
	"flag"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem"
	idemotel "github.com/idemgo/idem/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

var benchRounds = flag.Int("otel.rounds", 1,
	"rounds of BenchmarkAdapter: its sub-benchmarks alternate, so that a noisy machine affects both alike")

// BenchmarkAdapter measures Claim+Confirm on the real Redis at 64
// goroutines with no Observer and with the adapter (metrics to an SDK
// MeterProvider, spans to a sampling TracerProvider; store calls outside a
// span make no span), alternating for -otel.rounds rounds, and logs the
// median ratio on/off.
func BenchmarkAdapter(b *testing.B) {
	c := testRedis(b)
	obs, err := idemotel.New(idemotel.Options{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())),
		TracerProvider: sdktrace.NewTracerProvider(),
	})
	if err != nil {
		b.Fatal(err)
	}
	stores := map[string]*idem.RedisStore{
		"off": redisStore(b, c, idem.Options{}),
		"on":  redisStore(b, c, idem.Options{Observer: obs}),
	}
	var seq atomic.Int64
	ctx := context.Background()
	var ratios []float64
	for range *benchRounds {
		rate := map[string]float64{}
		for _, name := range []string{"off", "on"} {
			st := stores[name]
			b.Run("adapter="+name+"/goroutines=64", func(b *testing.B) {
				b.ReportAllocs()
				b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						cl, err := st.Claim(ctx, strconv.FormatInt(seq.Add(1), 36), nil)
						if err == nil {
							err = st.Confirm(ctx, cl.Lease, nil)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
				rate[name] = float64(b.N) / b.Elapsed().Seconds()
				b.ReportMetric(rate[name], "ops/s")
			})
		}
		if rate["off"] > 0 {
			ratios = append(ratios, rate["on"]/rate["off"])
		}
	}
	if len(ratios) > 0 {
		slices.Sort(ratios)
		b.Logf("adapter on/off throughput, median of %d rounds: %.3f× (rounds %.3f)", len(ratios), ratios[len(ratios)/2], ratios)
	}
}
