package idemotel_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"strings"

	"github.com/idemgo/idem"
	idemotel "github.com/idemgo/idem/otel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Export idem's metrics to Prometheus: the OpenTelemetry Prometheus
// exporter is a reader of the MeterProvider, and promhttp serves what it
// gathers on /metrics.
func Example_prometheus() {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		panic(err)
	}
	obs, err := idemotel.New(idemotel.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))})
	if err != nil {
		panic(err)
	}
	store, err := idem.NewMemoryStore(idem.Options{Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	cl, _ := store.Claim(ctx, "order-17", nil)
	_ = store.Confirm(ctx, cl.Lease, nil)
	_, _ = store.Claim(ctx, "order-17", nil)

	// In a server: http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	w := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(w.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "idem_operations_total") ||
			strings.HasPrefix(line, `idem_operation_duration_seconds_count{op="claim"}`) {
			fmt.Println(line)
		}
	}
	// Unordered output:
	// idem_operation_duration_seconds_count{op="claim"} 2
	// idem_operations_total{op="claim",outcome="claimed"} 1
	// idem_operations_total{op="claim",outcome="duplicate"} 1
	// idem_operations_total{op="confirm"} 1
}
