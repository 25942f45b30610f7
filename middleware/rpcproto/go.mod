module github.com/idemgo/idem/middleware/rpcproto

go 1.26.0

require (
	github.com/idemgo/idem v0.1.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dchest/siphash v1.2.3 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

// The protobuf half of the RPC core is developed with idem itself; its
// dependencies (protobuf, the google.rpc details) live in this module so
// that the root module's stay lean. Ignored where this module is a
// dependency, which gets the version required above.
replace github.com/idemgo/idem => ../../
