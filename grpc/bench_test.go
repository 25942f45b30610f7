package idemgrpc

import (
	"context"
	"net"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// BenchmarkUnary measures the server interceptor's added cost beside the
// bare handler, over bufconn (in memory) and loopback TCP, in one run:
//
//	bare     no interceptor, the handler answers
//	first    the interceptor, a new key every call: Claim, the handler, Confirm
//	replay   the interceptor, one key: Claim finds it done, the answer is decoded and sent
//	client   first, with the client interceptor too (a key made per call)
//
// The store is an idem.MemoryStore, so that the figures are the
// interceptor's and not a network store's (see the store benchmarks for
// those). Each variant runs on its own: on a busy machine its ns/op drift
// between them; BenchmarkUnarySideBySide alternates them for the ratios.
func BenchmarkUnary(b *testing.B) {
	h := func(ctx context.Context, method string, req proto.Message) (proto.Message, error) {
		return wrapperspb.String("order " + req.(*wrapperspb.StringValue).GetValue() + " created"), nil
	}
	for _, network := range []string{"bufconn", "loopback"} {
		for _, v := range []string{"bare", "first", "replay", "client"} {
			b.Run(network+"/"+v, func(b *testing.B) {
				var sopts []grpc.ServerOption
				if v != "bare" {
					s, err := NewServer(ServerOptions{Store: memStore(b), SingleTenant: true})
					if err != nil {
						b.Fatal(err)
					}
					sopts = append(sopts, grpc.ChainUnaryInterceptor(s.Unary))
				}
				var copts []grpc.DialOption
				if v == "client" {
					c, err := NewClient(ClientOptions{})
					if err != nil {
						b.Fatal(err)
					}
					copts = append(copts, grpc.WithChainUnaryInterceptor(c.Unary))
				}
				cc := benchConn(b, network, handlerFunc(h), sopts, copts)
				req := wrapperspb.String("1234")
				out := new(wrapperspb.StringValue)
				ctx := context.Background()
				if v == "replay" {
					ctx = metadata.AppendToOutgoingContext(ctx, DefaultMetadata, "bench-replay")
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					cctx := ctx
					if v == "first" {
						cctx = metadata.AppendToOutgoingContext(ctx, DefaultMetadata, "bench-"+strconv.Itoa(i))
					}
					if err := cc.Invoke(cctx, methodCreate, req, out); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// benchConn serves h with sopts on network and returns a connection to it.
func benchConn(b *testing.B, network string, h handlerFunc, sopts []grpc.ServerOption, copts []grpc.DialOption) *grpc.ClientConn {
	b.Helper()
	var l net.Listener
	copts = append(copts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	target := "passthrough:///bufnet"
	if network == "bufconn" {
		bl := bufconn.Listen(1 << 20)
		l = bl
		copts = append(copts, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return bl.DialContext(ctx) }))
	} else {
		var err error
		if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			b.Fatal(err)
		}
		target = "passthrough:///" + l.Addr().String()
	}
	srv := grpc.NewServer(sopts...)
	srv.RegisterService(ordersDesc(), h)
	go func() { _ = srv.Serve(l) }()
	b.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(target, copts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close() })
	return cc
}

// BenchmarkUnarySideBySide runs the variants of BenchmarkUnary in turn, in
// batches of 50 calls each, so that a machine's load weighs on all alike,
// and reports each variant's ns/op and allocs/op and its ratio to bare:
// the median of the per-batch ratios. docs/BENCHMARKS.md quotes it:
//
//	cd grpc && go test -run '^$' -bench SideBySide -benchtime 400x -count 3 .
func BenchmarkUnarySideBySide(b *testing.B) {
	h := handlerFunc(func(ctx context.Context, method string, req proto.Message) (proto.Message, error) {
		return wrapperspb.String("order " + req.(*wrapperspb.StringValue).GetValue() + " created"), nil
	})
	variants := []string{"bare", "first", "replay", "client"}
	for _, network := range []string{"bufconn", "loopback"} {
		b.Run(network, func(b *testing.B) {
			conns := make([]*grpc.ClientConn, len(variants))
			for i, v := range variants {
				var sopts []grpc.ServerOption
				if v != "bare" {
					s, err := NewServer(ServerOptions{Store: memStore(b), SingleTenant: true})
					if err != nil {
						b.Fatal(err)
					}
					sopts = append(sopts, grpc.ChainUnaryInterceptor(s.Unary))
				}
				var copts []grpc.DialOption
				if v == "client" {
					c, err := NewClient(ClientOptions{})
					if err != nil {
						b.Fatal(err)
					}
					copts = append(copts, grpc.WithChainUnaryInterceptor(c.Unary))
				}
				conns[i] = benchConn(b, network, h, sopts, copts)
			}
			req, out := wrapperspb.String("1234"), new(wrapperspb.StringValue)
			replayCtx := metadata.AppendToOutgoingContext(context.Background(), DefaultMetadata, "bench-replay")
			call := func(i, n int) {
				ctx := context.Background()
				switch variants[i] {
				case "first":
					ctx = metadata.AppendToOutgoingContext(ctx, DefaultMetadata, "bench-"+strconv.Itoa(n))
				case "replay":
					ctx = replayCtx
				}
				if err := conns[i].Invoke(ctx, methodCreate, req, out); err != nil {
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

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}
