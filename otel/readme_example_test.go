package idemotel_test

import (
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
	idemotel "github.com/idemgo/idem/otel"
)

// The README's blocks, compiled (their parameters are the reader's own
// names); Example_prometheus runs the second.
var _ = []any{readmeNew, readmePrometheus}

func readmeNew(mp metric.MeterProvider, tp trace.TracerProvider) (idem.Observer, error) {
	// README: otel
	obs, err := idemotel.New(idemotel.Options{MeterProvider: mp, TracerProvider: tp})
	// README end
	return obs, err
}

func readmePrometheus() (idem.Observer, error) {
	// README: prometheus
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		log.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	obs, err := idemotel.New(idemotel.Options{MeterProvider: mp})
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// README end
	return obs, err
}
