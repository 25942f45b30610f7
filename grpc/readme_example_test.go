package idemgrpc_test

import (
	"log"
	"time"

	"google.golang.org/grpc"

	"github.com/idemgo/idem"
	idemgrpc "github.com/idemgo/idem/grpc"
)

// The README's block, compiled (its parameters are the reader's own
// names); the module's tests and its demo run the same interceptors.
var _ = readmeInterceptors

func readmeInterceptors(store idem.Store, target string, creds grpc.DialOption) (*grpc.Server, *grpc.ClientConn, error) {
	// README: grpc
	s, err := idemgrpc.NewServer(idemgrpc.ServerOptions{Store: store, SingleTenant: true})
	if err != nil {
		log.Fatal(err) // e.g. idemgrpc: ServerOptions.ReplayMetadata: "authorization" may not be replayed: ...
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.Unary), grpc.ChainStreamInterceptor(s.Stream))

	c, err := idemgrpc.NewClient(idemgrpc.ClientOptions{AttemptTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithChainUnaryInterceptor(c.Unary), creds)
	// README end
	return srv, conn, err
}
