module github.com/idemgo/idem/echo

go 1.26.0

require (
	github.com/idemgo/idem v0.1.0
	github.com/labstack/echo/v4 v4.16.5
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dchest/siphash v1.2.3 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/labstack/gommon v0.5.0 // indirect
	github.com/mattn/go-colorable v0.1.15 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	github.com/valyala/fasttemplate v1.2.2 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	golang.org/x/time v0.15.0 // indirect
)

// The adapter is developed with idem itself; its dependency tree (Echo) lives
// in this module so that the root module's stays lean. Ignored where this
// module is a dependency, which gets the version required above.
replace github.com/idemgo/idem => ../
