package idemconnect_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgo/idem"
	idemconnect "github.com/idemgo/idem/connect"
)

// The interceptors on a Connect procedure and its client, as the README
// shows them, self-contained: the procedure takes and answers protobuf's
// well-known StringValue, so no generated code is needed. A retry with the
// same key gets the recorded response, and the order is created once.
func ExampleNewServer() {
	store, err := idem.NewMemoryStore(idem.Options{}) // or idem.NewRedisStore, sqlstore.New
	if err != nil {
		log.Fatal(err)
	}
	// README: connect
	s, err := idemconnect.NewServer(idemconnect.ServerOptions{Store: store, SingleTenant: true})
	if err != nil {
		log.Fatal(err) // e.g. idemconnect: ServerOptions.ReplayHeaders: "Set-Cookie" may not be replayed: ...
	}
	const procedure = "/orders.v1.Orders/Create" // generated code names it ordersv1connect.OrdersCreateProcedure
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure,
		func(ctx context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
			return connect.NewResponse(wrapperspb.String(createOrder(ctx, req.Msg.GetValue()))), nil
		}, connect.WithInterceptors(s)))
	srv := httptest.NewServer(mux) // or http.ListenAndServe(addr, mux)
	defer srv.Close()

	c, err := idemconnect.NewClient(idemconnect.ClientOptions{AttemptTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	orders := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](http.DefaultClient,
		srv.URL+procedure, connect.WithInterceptors(c)) // each call one key, kept across its retries
	// README end

	ctx := context.Background()
	for range 2 {
		req := connect.NewRequest(wrapperspb.String("book"))
		req.Header().Set("Idempotency-Key", "order-7f3a") // a retry of the same logical call
		resp, err := orders.CallUnary(ctx, req)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.Msg.GetValue(), "| replayed:", resp.Header().Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// order 1: book | replayed: false
	// order 1: book | replayed: true
}

var created int

// createOrder stands for the application's own write.
func createOrder(ctx context.Context, item string) string {
	created++
	return fmt.Sprintf("order %d: %s", created, item)
}
