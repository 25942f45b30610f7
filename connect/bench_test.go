package idemconnect

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// BenchmarkUnary runs each variant of BenchmarkUnarySideBySide on its own,
// with -benchmem's figures, for profiles; on a busy machine its ns/op
// drift between variants, which the side-by-side run is for.
func BenchmarkUnary(b *testing.B) {
	h := handlerFunc(func(ctx context.Context, proc string, r *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
		return connect.NewResponse(wrapperspb.String("order " + r.Msg.GetValue() + " created")), nil
	})
	for _, p := range benchProtocols() {
		for _, v := range []string{"bare", "first", "replay", "client"} {
			b.Run(p.name+"/"+v, func(b *testing.B) {
				o := benchClient(b, h, p.opt, v)
				ctx := context.Background()
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					if _, err := o.create.CallUnary(ctx, benchRequest(v, i)); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// benchClient serves h for variant v and returns its client.
func benchClient(b *testing.B, h handlerFunc, proto []connect.ClientOption, v string) *orders {
	var hopts []connect.HandlerOption
	if v != "bare" {
		s, err := NewServer(ServerOptions{Store: memStore(b), SingleTenant: true})
		if err != nil {
			b.Fatal(err)
		}
		hopts = append(hopts, connect.WithInterceptors(s))
	}
	copts := append([]connect.ClientOption(nil), proto...)
	if v == "client" {
		c, err := NewClient(ClientOptions{})
		if err != nil {
			b.Fatal(err)
		}
		copts = append(copts, connect.WithInterceptors(c))
	}
	srv := startServer(b, ordersMux(h, hopts...))
	return newOrders(srv.Client(), srv.URL, copts...)
}

// benchRequest is call n's request for variant v: a new key per call for
// first, one key for replay, none for bare and client (the client
// interceptor makes one).
func benchRequest(v string, n int) *connect.Request[wrapperspb.StringValue] {
	req := connect.NewRequest(wrapperspb.String("1234"))
	switch v {
	case "first":
		req.Header().Set(DefaultHeader, "bench-"+strconv.Itoa(n))
	case "replay":
		req.Header().Set(DefaultHeader, "bench-replay")
	}
	return req
}

// BenchmarkUnarySideBySide measures the server interceptor's added cost
// beside the bare Connect handler, on the Connect protocol and on the
// gRPC protocol (both over TLS and HTTP/2 on loopback, as the tests
// serve them), in one run:
//
//	bare     no interceptor, the handler answers
//	first    the interceptor, a new key every call: Claim, the handler, Confirm
//	replay   the interceptor, one key: Claim finds it done, the answer is decoded and sent
//	client   first, with the client interceptor too (a key made per call)
//
// The variants run in turn, in batches of 50 calls each, so that a
// machine's load weighs on all alike; each variant's ratio to bare is the
// median of the per-batch ratios. The store is an idem.MemoryStore, so
// that the figures are the interceptor's and not a network store's.
// docs/BENCHMARKS.md quotes it:
//
//	cd connect && go test -run '^$' -bench SideBySide -benchtime 400x -count 3 .
func BenchmarkUnarySideBySide(b *testing.B) {
	h := handlerFunc(func(ctx context.Context, proc string, r *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
		return connect.NewResponse(wrapperspb.String("order " + r.Msg.GetValue() + " created")), nil
	})
	variants := []string{"bare", "first", "replay", "client"}
	for _, p := range benchProtocols() {
		b.Run(p.name, func(b *testing.B) {
			clients := make([]*orders, len(variants))
			for i, v := range variants {
				clients[i] = benchClient(b, h, p.opt, v)
			}
			ctx := context.Background()
			call := func(i, n int) {
				if _, err := clients[i].create.CallUnary(ctx, benchRequest(variants[i], n)); err != nil {
					b.Fatal(err)
				}
			}
			for i := range variants { // warm up: connections made, the replay's key recorded
				call(i, -1)
			}
			const batch = 50
			var ms runtime.MemStats
			ns := make([][]float64, len(variants))
			allocs := make([]uint64, len(variants))
			calls := 0
			b.ResetTimer()
			for b.Loop() {
				for i := range variants {
					runtime.ReadMemStats(&ms)
					before := ms.Mallocs
					start := time.Now()
					for k := range batch {
						call(i, calls+k)
					}
					ns[i] = append(ns[i], float64(time.Since(start).Nanoseconds())/batch)
					runtime.ReadMemStats(&ms)
					allocs[i] += ms.Mallocs - before
				}
				calls += batch
			}
			for i, v := range variants {
				b.ReportMetric(median(ns[i]), v+"-ns/op")
				b.ReportMetric(float64(allocs[i])/float64(calls), v+"-allocs/op")
				if i > 0 {
					ratios := make([]float64, len(ns[i]))
					for j := range ratios {
						ratios[j] = ns[i][j] / ns[0][j]
					}
					b.ReportMetric(median(ratios), v+"/bare")
				}
			}
			b.ReportMetric(0, "ns/op") // the figures above are per call of each variant
		})
	}
}

// benchProtocols are the Connect protocol (binary) and the gRPC protocol.
func benchProtocols() []protocol {
	return slices.DeleteFunc(slices.Clone(protocols), func(p protocol) bool { return p.name != "connect" && p.name != "grpc" })
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}
