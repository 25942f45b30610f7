package idemotel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemgo/idem"
	idemotel "github.com/idemgo/idem/otel"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// redisStore returns a RedisStore with a prefix of its own.
func redisStore(t testing.TB, c *redis.Client, o idem.Options) *idem.RedisStore {
	t.Helper()
	ro := idem.RedisOptions{Retention: o.Retention, LeaseTTL: o.LeaseTTL, Worker: o.Worker,
		MaxKeyBytes: o.MaxKeyBytes, MaxResultBytes: o.MaxResultBytes, Logger: o.Logger,
		Observer: o.Observer, KeyHasher: o.KeyHasher, RevealKeys: o.RevealKeys}
	ro.Prefix = fmt.Sprintf("idemotel:%s:%d:", t.Name(), time.Now().UnixNano())
	s, err := idem.NewRedisStore(c, ro)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sdk is an Observer on in-memory SDK providers.
type sdk struct {
	obs    *idemotel.Observer
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
}

func newSDK(t testing.TB) *sdk {
	t.Helper()
	s := &sdk{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	var err error
	if s.obs, err = idemotel.New(idemotel.Options{MeterProvider: mp, TracerProvider: s.tp}); err != nil {
		t.Fatal(err)
	}
	return s
}

// metrics collects the reader's metrics by name.
func (s *sdk) metrics(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// count is the sum of the points of counter name whose attributes include
// all of want (a value "" means the attribute is absent).
func (s *sdk) count(t *testing.T, name string, want map[string]string) int64 {
	t.Helper()
	sum, ok := s.metrics(t)[name].(metricdata.Sum[int64])
	if !ok {
		return 0
	}
	var n int64
	for _, p := range sum.DataPoints {
		match := true
		for k, v := range want {
			got, ok := p.Attributes.Value(attrKey(k))
			if (v == "" && ok) || (v != "" && (!ok || got.AsString() != v)) {
				match = false
			}
		}
		if match {
			n += p.Value
		}
	}
	return n
}
