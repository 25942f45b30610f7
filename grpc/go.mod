module github.com/idemgo/idem/grpc

go 1.26.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/google/uuid v1.6.0
	github.com/idemgo/idem v0.1.0
	github.com/idemgo/idem/middleware/rpcproto v0.1.0
	github.com/redis/go-redis/v9 v9.23.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dchest/siphash v1.2.3 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

// The interceptors are developed with idem itself (and the RPC core's
// protobuf half, middleware/rpcproto); their dependency tree
// (grpc-go, protobuf) lives in this module so that the root module's stays
// lean.
replace (
	github.com/idemgo/idem => ../
	github.com/idemgo/idem/middleware/rpcproto => ../middleware/rpcproto
)
