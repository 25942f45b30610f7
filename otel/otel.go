package idemotel

import (
	"context"
	"time"

	"github.com/idemgo/idem"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/idemgo/idem/otel"

// DurationBuckets are the histogram bucket bounds, in seconds: an
// in-process store answers in microseconds, Redis in a fraction of a
// millisecond, SQL in milliseconds, and a request or message lasts as long
// as its handler.
var DurationBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// Options configure New. The zero value is valid.
type Options struct {
	// MeterProvider makes the instruments. Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider makes the spans. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// numbers of ops, outcomes and classes, for the precomputed attribute sets.
const (
	// nOps is above every Op of this release and the next few, so that an
	// Op added to idem later is reported under its name without a change
	// here; the zero Op and any beyond read "op".
	nOps      = 32
	nOutcomes = int(idem.InProgress) + 1
	nClasses  = int(idem.ClassQuarantined) + 1
	// nCacheResults counts idem.CacheResult's values, zero included.
	nCacheResults = int(idem.CacheMiss) + 1
)

// Observer reports idem's events to OpenTelemetry (see the package
// documentation for what it reports). It implements idem.Observer and
// idem.Starter and is safe for concurrent use.
type Observer struct {
	tracer   trace.Tracer
	ops      metric.Int64Counter
	duration metric.Float64Histogram
	takeover metric.Int64Counter
	late     metric.Int64Counter
	quarant  metric.Int64Counter
	cache    metric.Int64Counter

	// Attribute sets are built once: building one per event would cost
	// allocations on every store call.
	opsAttrs [nOps][nOutcomes][nClasses]metric.MeasurementOption
	opAttrs  [nOps]metric.MeasurementOption
	// cacheAttrs[op][r] labels the keys an idem.Cache answered (CacheHit)
	// or passed on (CacheMiss) in an op.
	cacheAttrs [nOps][nCacheResults]metric.MeasurementOption
}

// New returns an Observer built on o's providers.
func New(o Options) (*Observer, error) {
	mp, tp := o.MeterProvider, o.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(ScopeName)
	ob := &Observer{tracer: tp.Tracer(ScopeName)}
	var err error
	if ob.ops, err = m.Int64Counter("idem.operations", metric.WithUnit("{operation}"),
		metric.WithDescription("idem operations, by op, outcome and error class")); err != nil {
		return nil, err
	}
	if ob.duration, err = m.Float64Histogram("idem.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of idem operations, by op"),
		metric.WithExplicitBucketBoundaries(DurationBuckets...)); err != nil {
		return nil, err
	}
	if ob.takeover, err = m.Int64Counter("idem.takeovers", metric.WithUnit("{claim}"),
		metric.WithDescription("Claims that took over an expired claim, by op")); err != nil {
		return nil, err
	}
	if ob.late, err = m.Int64Counter("idem.late_confirms", metric.WithUnit("{confirm}"),
		metric.WithDescription("Confirmations recorded after their lease was lost, by op")); err != nil {
		return nil, err
	}
	if ob.quarant, err = m.Int64Counter("idem.quarantines", metric.WithUnit("{operation}"),
		metric.WithDescription("Operations refused because their key is quarantined after repeated crashes (idem.ErrQuarantined), by op")); err != nil {
		return nil, err
	}
	if ob.cache, err = m.Int64Counter("idem.cache.keys", metric.WithUnit("{key}"),
		metric.WithDescription("Keys of Claim, Lookup and ClaimBatch calls made through an idem.Cache, by op and result: hit (answered from memory) or miss (passed on to the store)")); err != nil {
		return nil, err
	}
	for op := 0; op < nOps; op++ {
		opKV := attribute.String("op", idem.Op(op).String())
		ob.opAttrs[op] = metric.WithAttributeSet(attribute.NewSet(opKV))
		for r := 1; r < nCacheResults; r++ {
			ob.cacheAttrs[op][r] = metric.WithAttributeSet(attribute.NewSet(opKV,
				attribute.String("result", idem.CacheResult(r).String())))
		}
		for out := range nOutcomes {
			for class := range nClasses {
				kvs := []attribute.KeyValue{opKV}
				if out != 0 {
					kvs = append(kvs, attribute.String("outcome", idem.Outcome(out).String()))
				}
				if class != 0 {
					kvs = append(kvs, attribute.String("error_class", idem.ErrorClass(class).String()))
				}
				ob.opsAttrs[op][out][class] = metric.WithAttributeSet(attribute.NewSet(kvs...))
			}
		}
	}
	return ob, nil
}

// started marks a context that Start returned, with the span it opened, so
// that Observe ends that span and no other.
type started struct{ span trace.Span }

type startedKey struct{}

// Start opens the span of a request (idem.OpRequest) or message
// (idem.OpMessage) and returns a context that carries it.
func (ob *Observer) Start(ctx context.Context, op idem.Op) context.Context {
	ctx, span := ob.tracer.Start(ctx, "idem."+op.String(), trace.WithSpanKind(trace.SpanKindInternal))
	return context.WithValue(ctx, startedKey{}, &started{span: span})
}

// Observe records e's metrics and, as the package documentation says, its
// span.
func (ob *Observer) Observe(ctx context.Context, e idem.Event) {
	op, out, class := int(e.Op), int(e.Outcome), int(e.Class())
	if op >= nOps || out >= nOutcomes || class >= nClasses {
		op, out, class = 0, 0, 0 // not an event of this release: reported as op "op"
	}
	ob.ops.Add(ctx, 1, ob.opsAttrs[op][out][class])
	ob.duration.Record(ctx, e.Took.Seconds(), ob.opAttrs[op])
	if e.TakeOver {
		ob.takeover.Add(ctx, 1, ob.opAttrs[op])
	}
	if e.Late {
		ob.late.Add(ctx, 1, ob.opAttrs[op])
	}
	if idem.ErrorClass(class) == idem.ClassQuarantined {
		ob.quarant.Add(ctx, 1, ob.opAttrs[op])
	}
	if r := int(e.Cache); r != 0 && r < nCacheResults && op != 0 {
		ob.cache.Add(ctx, int64(max(e.Items, 1)), ob.cacheAttrs[op][r])
	}

	if e.Op == idem.OpRequest || e.Op == idem.OpMessage {
		if st, ok := ctx.Value(startedKey{}).(*started); ok && st.span.IsRecording() {
			setAttributes(st.span, &e, idem.ErrorClass(class))
			st.span.End()
		}
		return
	}
	if !trace.SpanFromContext(ctx).IsRecording() {
		return
	}
	end := time.Now()
	_, span := ob.tracer.Start(ctx, "idem."+e.Op.String(), trace.WithTimestamp(end.Add(-e.Took)),
		trace.WithSpanKind(trace.SpanKindInternal))
	setAttributes(span, &e, idem.ErrorClass(class))
	span.End(trace.WithTimestamp(end))
}

func setAttributes(span trace.Span, e *idem.Event, class idem.ErrorClass) {
	kvs := make([]attribute.KeyValue, 0, 8)
	kvs = append(kvs, attribute.String("idem.op", e.Op.String()))
	if e.Outcome != 0 {
		kvs = append(kvs, attribute.String("idem.outcome", e.Outcome.String()))
	}
	if e.KeyHash != "" {
		kvs = append(kvs, attribute.String("idem.key_hash", e.KeyHash))
	}
	if e.Items > 1 || e.Op == idem.OpClaimBatch || e.Op == idem.OpConfirmBatch {
		kvs = append(kvs, attribute.Int("idem.items", e.Items))
	}
	if e.TakeOver {
		kvs = append(kvs, attribute.Bool("idem.take_over", true))
	}
	if e.Late {
		kvs = append(kvs, attribute.Bool("idem.late", true))
	}
	if e.Cache != 0 {
		kvs = append(kvs, attribute.String("idem.cache", e.Cache.String()))
	}
	if class != idem.ClassNone {
		kvs = append(kvs, attribute.String("error.type", class.String()))
	}
	span.SetAttributes(kvs...)
	if class == idem.ClassStore || class == idem.ClassDamaged {
		// The error's text can hold addresses, never a key: keys are
		// hashed in idem's errors.
		span.SetStatus(codes.Error, e.Err.Error())
	}
}

var (
	_ idem.Observer = (*Observer)(nil)
	_ idem.Starter  = (*Observer)(nil)
)
